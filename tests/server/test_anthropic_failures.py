"""/v1/messages when things are slow or break: pings, mid-stream failures, vanished clients, no fleet."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from harness import free_port, metric, scrape, start_frontend, wait_until
from harness import in_flight as in_flight_total
from tests.server.conftest import MODEL, Fleet, make_fleet
from tests.server.test_anthropic_api import assert_same_message

pytestmark = pytest.mark.slow  # spawns fleets of real processes

SLOW_PREFILL = ("--block-size", "16", "--num-kv-blocks", "2048", "--speedup-ratio", "1", "--prefill-constant", "2500")


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path) -> Iterator[Fleet]:
    """One worker whose first token takes 2.5 s (past the frontend's 1 s ping threshold)."""
    f = make_fleet(tmp_path_factory.mktemp("slow"), qwen_tokenizer_dir, n=1, mock_args=SLOW_PREFILL)
    yield f
    f.stop()


def stream_lines(url: str, body: dict[str, Any]) -> Iterator[tuple[float, str, dict[str, Any]]]:
    """(seconds since the request, event name, data) as each event arrives."""
    started = time.monotonic()
    with httpx.Client(timeout=60) as http, http.stream("POST", url + "/v1/messages", json=body) as resp:
        assert resp.status_code == 200
        name = ""
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                yield time.monotonic() - started, name, json.loads(line[6:])


def test_pings_while_the_first_token_is_slow(slow: Fleet) -> None:
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "slowly"}]}
    events = list(stream_lines(slow.frontend.url, body))
    names = [n for _, n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
    first_block = next(t for t, n, _ in events if n == "content_block_start")
    assert events[0][0] < 2.0 < first_block  # message_start and a ping went out while prefill ran
    assert names.count("message_start") == 1


def test_slow_stream_through_the_sdk_is_complete(slow: Fleet) -> None:
    c = anthropic.Anthropic(base_url=slow.frontend.url, api_key="unused", max_retries=0, timeout=60)
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "sdk slow"}]}
    with c.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    whole = c.messages.create(**kwargs)
    assert_same_message(streamed, whole)
    assert streamed.stop_reason == "max_tokens"


def test_disconnect_while_waiting_for_the_first_token_cancels_upstream(slow: Fleet) -> None:
    body = {"model": MODEL, "max_tokens": 2000, "stream": True, "messages": [{"role": "user", "content": "bye"}]}
    for _, name, _ in stream_lines(slow.frontend.url, body):
        if name == "ping":
            assert in_flight_total(slow.frontend.url) == 1
            break
    engine = slow.workers[0].url
    wait_until(lambda: metric(scrape(engine), "vllm:num_requests_running") == 0
                    and metric(scrape(engine), "vllm:num_requests_waiting") == 0, 20, "the engine idle")
    wait_until(lambda: in_flight_total(slow.frontend.url) == 0, 20, "every load ticket released")


def test_worker_killed_mid_stream_ends_with_an_error_event(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    f = make_fleet(tmp_path, qwen_tokenizer_dir, n=1, mock_args=("--speedup-ratio", "1"))
    try:
        body = {"model": MODEL, "max_tokens": 3000, "stream": True, "messages": [{"role": "user", "content": "on"}]}
        names = []
        for _, name, data in stream_lines(f.frontend.url, body):
            names.append(name)
            if names.count("content_block_delta") == 3:
                f.workers[0].kill()
            if name == "error":
                assert data["error"]["type"] == "api_error" and data["error"]["message"]
        assert names[-1] == "error" and "message_stop" not in names
        wait_until(lambda: in_flight_total(f.frontend.url) == 0, 20, "every load ticket released")
        assert metric(scrape(f.frontend.url), "infera_requests_total", endpoint="/v1/messages",
                      status="stream_error") == 1
    finally:
        f.stop()


def test_no_workers_is_529_overloaded(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    frontend = start_frontend(tmp_path, [nowhere], tokenizer=qwen_tokenizer_dir, expect_workers=0)
    try:
        for stream in (False, True):
            resp = httpx.post(frontend.url + "/v1/messages", json={
                "model": MODEL, "max_tokens": 5, "stream": stream, "messages": [{"role": "user", "content": "x"}]})
            assert resp.status_code == 529
            assert resp.json() == {"type": "error", "error": {"type": "overloaded_error",
                                                              "message": "no workers are available"},
                                   "request_id": resp.headers["x-request-id"]}
    finally:
        frontend.stop()
