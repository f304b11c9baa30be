"""The inference routes' short way in (``infera.server.hot_routes``) behaves as the full FastAPI stack:
every app middleware applies, an unexpected failure is a 500 in the API's shape, other methods and
paths are routed as before."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from infera.router.router import Router, RouterOptions
from infera.server.__main__ import DefaultWorkerHeader
from infera.server.app import build_app, install_operations
from tests.fakes import MODEL, FakeFleet, FakeTransport, worker

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
MESSAGES = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def make(mode: str = "auto", admin_token: str = "") -> tuple[FastAPI, Router, FakeTransport]:
    transport = FakeTransport(None, text="hello there")
    router = Router(FakeFleet(worker("w1"), worker("w2")), transport, None, None,
                    RouterOptions(mode=mode, policy="round-robin"), rng=random.Random(1))
    app = build_app(router, max_body_bytes=1 << 16, strip_patterns=[])
    install_operations(app, router, strip_patterns=[], admin_token=admin_token)
    return app, router, transport


def client(app: FastAPI, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, **kw), base_url="http://infera")


async def test_a_middleware_added_after_the_routes_applies_to_them() -> None:
    app, _, transport = make(mode="direct")
    app.add_middleware(DefaultWorkerHeader, worker="w2")
    async with client(app) as c:
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)):
            resp = await c.post(path, json=body)
            assert resp.status_code == 200 and resp.headers["x-infera-worker"] == "w2"
            assert resp.headers["x-request-id"].startswith("req_")
    assert len(transport.calls) == 2


@pytest.mark.parametrize(("path", "body", "shape"), [("/v1/chat/completions", CHAT, "openai"),
                                                     ("/v1/completions", {"model": MODEL, "prompt": "hi"}, "openai"),
                                                     ("/v1/messages", MESSAGES, "anthropic")])
async def test_an_unexpected_failure_is_a_500_in_the_apis_shape(path: str, body: dict[str, Any], shape: str) -> None:
    app, router, _ = make()

    async def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("boom")

    router.dispatch = broken  # type: ignore[method-assign]
    async with client(app, raise_app_exceptions=False) as c:
        resp = await c.post(path, json=body)
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert error["type"] == "api_error" if shape == "anthropic" else error["message"] == "internal error: RuntimeError"


async def test_other_methods_and_paths_take_the_full_stack() -> None:
    app, _, _ = make(admin_token="sekrit")
    async with client(app) as c:
        assert (await c.get("/v1/chat/completions")).status_code == 405
        assert (await c.post("/v1/chat/completions/", json=CHAT)).status_code in (200, 307)
        assert (await c.post("/v1/cache/prewarm", json={})).status_code == 401
        assert "/v1/chat/completions" in (await c.get("/openapi.json")).json()["paths"]


async def test_a_whole_answer_is_sent_before_it_is_accounted() -> None:
    """The answer's last byte does not wait for the metrics; they are in once the request is done."""
    app, _, _ = make()
    body = orjson.dumps(CHAT)
    counted_at_send: list[bool] = []
    requests = app.state.metrics.requests
    ttft = app.state.metrics.ttft

    def counted() -> bool:
        return any(s.name.endswith("_total") and s.labels.get("status") == "200" and s.value >= 1
                   for m in requests.collect() for s in m.samples)

    def timed() -> bool:  # its time to first byte too: measured before the answer, recorded after it
        return any(s.name.endswith("_count") and s.labels.get("endpoint") == "/v1/chat/completions" and s.value == 1
                   for m in ttft.collect() for s in m.samples)

    done = asyncio.Event()
    sent: list[bool] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the client stays until the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            counted_at_send.append(counted() or timed())
            done.set()

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("infera", 80), "http_version": "1.1"}
    await app(scope, receive, send)
    assert counted_at_send == [False]
    assert counted() and timed()
