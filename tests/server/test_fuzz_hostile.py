"""Hostile request bodies and headers in-process: every one gets a non-5xx answer in the shape of the API it
was sent to, and what reaches an engine is only what passed validation."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.fuzz import JSON_PATHS, Hostile, hostile_bodies, shaped
from infera.kv.tokenizer import PromptRenderer
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app, install_operations
from tests.fakes import MODEL, FakeFleet, FakeTransport, kvd_stub, worker

MAX_BODY = 1 << 20
CASES = list(hostile_bodies(MODEL, huge_chars=200_000))


def test_the_catalogue_covers_every_json_endpoint_and_kind() -> None:
    assert {c.path for c in CASES} == set(JSON_PATHS)
    assert len({c.name for c in CASES}) >= 26


@pytest.fixture
def kvd_socket(tmp_path: Path) -> Iterator[str]:
    with kvd_stub(str(tmp_path / "kvd.sock")) as path:
        yield path


@pytest.fixture
async def app(kvd_socket: str) -> tuple[httpx.AsyncClient, FakeTransport]:
    transport = FakeTransport(text="hello there")
    router = Router(FakeFleet(worker("w1"), worker("w2")), transport, None, PromptRenderer.byte_level(),
                    RouterOptions(policy="round-robin"), rng=random.Random(1))
    server = build_app(router, max_body_bytes=MAX_BODY, strip_patterns=[])
    install_operations(server, router, strip_patterns=[], kvd_socket_path=kvd_socket)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://infera"), transport


async def test_every_hostile_body_gets_a_4xx_or_an_answer_in_the_apis_shape(
        app: tuple[httpx.AsyncClient, FakeTransport]) -> None:
    client, transport = app
    wrong: list[str] = []
    statuses: dict[str, set[int]] = {}
    async with client:
        for case in CASES:
            resp = await client.post(case.path, content=case.body, headers=dict(case.headers))
            problem = shaped(case.path, resp.status_code, resp.headers.get("content-type", ""), resp.content)
            if problem:
                wrong.append(f"{case.name} -> {case.path}: {problem}")
            statuses.setdefault(case.name, set()).add(resp.status_code)
    assert not wrong, "\n".join(wrong)
    # malformed JSON is refused at intake by every endpoint, never forwarded
    for name in ("deep-array", "invalid-utf8", "lone-surrogate", "bom", "nan", "float-inf", "truncated",
                 "trailing-garbage", "not-json", "empty-body", "top-level-string"):
        assert statuses[name] <= {400, 403}, (name, statuses[name])
    forwarded = [c.body for c in transport.calls]
    assert all(isinstance(b, dict) and isinstance(b.get("model"), str) for b in forwarded)


@pytest.mark.parametrize("case", [c for c in CASES if c.name == "duplicate-keys"], ids=lambda c: c.path)
async def test_duplicate_keys_take_the_last_value_as_validated_and_as_forwarded(
        app: tuple[httpx.AsyncClient, FakeTransport], case: Hostile) -> None:
    client, transport = app
    async with client:
        resp = await client.post(case.path, content=case.body, headers=dict(case.headers))
    assert resp.status_code < 500
    # what the router validated ("model" last = the served one) is what the engine is sent: no smuggling
    assert all(c.body["model"] == MODEL for c in transport.calls)


@pytest.mark.parametrize("prompt", [[2**32], [-1], [[1, 2], [2**40]], [1, 2**63]])
async def test_token_ids_outside_32_bits_are_refused_before_any_engine(
        app: tuple[httpx.AsyncClient, FakeTransport], prompt: list[object]) -> None:
    client, transport = app
    async with client:
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
        fine = await client.post("/v1/completions", json={"model": MODEL, "prompt": [0, 2**32 - 1], "max_tokens": 2})
    assert resp.status_code == 400 and resp.json()["error"]["param"].startswith("prompt")
    assert fine.status_code == 200
    assert [c.body["prompt"] for c in transport.calls] == [[0, 2**32 - 1]]
