"""A model id as tokenizer: found offline in a Hugging Face cache laid out as huggingface_hub does."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness import start_frontend, start_mock
from infera.kv.tokenizer import PromptRenderer, TokenizerLoadError
from infera.kv.tokenizer_source import REQUIRED, TokenizerNotFoundError, hub_cache, resolve_tokenizer_dir

MODEL = "Qwen/Qwen3-0.6B"
MAIN = "a" * 40
OTHER = "b" * 40


def add_snapshot(cache: Path, repo_id: str, commit: str, files: dict[str, bytes], ref: str | None = None) -> Path:
    """One snapshot in huggingface_hub's layout: content in blobs/<sha256>, symlinked from snapshots/<commit>."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path: Path, qwen_tokenizer_dir: Path) -> Path:
    """A hub cache holding the Qwen tokenizer at main, and a second revision on branch v2."""
    root = tmp_path / "hub"
    files = {name: (qwen_tokenizer_dir / name).read_bytes() for name in REQUIRED}
    add_snapshot(root, MODEL, MAIN, files, ref="main")
    add_snapshot(root, MODEL, OTHER, files, ref="v2")
    return root


def test_a_model_id_loads_from_the_hub_cache(cache: Path, qwen_tokenizer_dir: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(cache.parent)  # no ./Qwen/Qwen3-0.6B folder shadows the id
    from_id = PromptRenderer.from_dir(MODEL, fast=False)
    from_dir = PromptRenderer.from_dir(qwen_tokenizer_dir, fast=False)
    messages = [{"role": "user", "content": "Where is the cache?"}]
    assert from_id.chat_token_ids(messages) == from_dir.chat_token_ids(messages)
    assert from_id.name.endswith(f"snapshots/{MAIN}")


def test_revisions_by_ref_name_and_by_commit_hash(cache: Path) -> None:
    env = {"HF_HUB_CACHE": str(cache)}
    assert resolve_tokenizer_dir(MODEL, environ=env).name == MAIN
    assert resolve_tokenizer_dir(MODEL, "v2", environ=env).name == OTHER
    assert resolve_tokenizer_dir(MODEL, OTHER, environ=env).name == OTHER
    with pytest.raises(TokenizerNotFoundError, match="refs/v3"):
        resolve_tokenizer_dir(MODEL, "v3", environ=env)


def test_the_cache_is_found_where_huggingface_hub_looks(tmp_path: Path) -> None:
    assert hub_cache({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hub_cache({"HF_HOME": "/b"}) == Path("/b/hub")
    assert hub_cache({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/hub")
    assert hub_cache({}) == Path.home() / ".cache" / "huggingface" / "hub"


def test_a_local_folder_wins_over_the_cache(cache: Path, qwen_tokenizer_dir: Path) -> None:
    assert resolve_tokenizer_dir(str(qwen_tokenizer_dir), environ={"HF_HUB_CACHE": str(cache)}) == qwen_tokenizer_dir


def test_a_snapshot_without_the_tokenizer_files_says_which_are_missing(tmp_path: Path) -> None:
    add_snapshot(tmp_path, MODEL, MAIN, {"config.json": b"{}"}, ref="main")
    with pytest.raises(TokenizerNotFoundError, match=r"lacks tokenizer\.json, tokenizer_config\.json"):
        resolve_tokenizer_dir(MODEL, environ={"HF_HUB_CACHE": str(tmp_path)})


def test_nothing_found_names_every_place_and_how_to_fill_the_cache(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TokenizerLoadError) as exc:
        PromptRenderer.from_dir(MODEL)
    text = str(exc.value)
    assert f"no folder {tmp_path / MODEL}" in text
    assert f"no {tmp_path / 'hf' / 'hub' / 'models--Qwen--Qwen3-0.6B'}" in text
    assert f"huggingface-cli download {MODEL} tokenizer.json tokenizer_config.json" in text


@pytest.mark.slow  # spawns the server process
def test_the_server_exits_with_that_message(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "infera.server", "--router-tokenizer-path", MODEL,
                           "--discovery-backend", "static", "--worker-url", "http://127.0.0.1:9",
                           "--request-transport", "http", "--kv-event-transport", "zmq"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert "not found" in done.stderr and "huggingface-cli download" in done.stderr


@pytest.mark.slow
def test_a_frontend_routes_kv_aware_with_a_model_id_tokenizer(cache: Path, tmp_path: Path,
                                                              qwen_tokenizer_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # the processes it starts inherit it
    worker = start_mock(tmp_path, model_path=qwen_tokenizer_dir, model=MODEL)
    try:
        fe = start_frontend(tmp_path, [worker], tokenizer=MODEL, policy="kv-aware")
        try:
            resp = httpx.post(fe.url + "/v1/chat/completions", timeout=30, json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
            assert resp.status_code == 200, resp.text
        finally:
            fe.stop()
    finally:
        worker.stop()
