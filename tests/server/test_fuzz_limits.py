"""Limits on what a client may send: body sizes on every JSON endpoint, the profiler's bad input, and the
client header/body deadlines against slow-drip clients, through a real uvicorn in this process."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from infera.router.router import Router, RouterOptions
from infera.server.app import build_app, install_operations
from infera.server.deadlines import with_deadlines
from tests.fakes import MODEL, FakeFleet, FakeTransport, kvd_stub, worker
from tests.serving import uvicorn_port

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
MESSAGES = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
TEN_MB = 10 * 1024 * 1024


def make_app(*workers: Any, max_body: int = 64 * 1024) -> tuple[Starlette, FakeTransport]:
    transport = FakeTransport(text="hello there")
    router = Router(FakeFleet(*(workers or (worker("w1"),))), transport, None, None,
                    RouterOptions(policy="round-robin"), rng=random.Random(1))
    app = build_app(router, max_body_bytes=max_body, strip_patterns=[])
    install_operations(app, router, strip_patterns=[], enable_profiling=True, profile_timeout=5,
                       kvd_socket_path="/nonexistent/kvd.sock")
    return app, transport


def client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://infera")


JSON_ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                  "/v1/cache/prewarm", "/v1/admin/profile/start", "/v1/admin/profile/stop"]


def shape_ok(path: str, body: dict[str, Any]) -> bool:
    if path.startswith("/v1/messages"):
        return body.get("type") == "error" and isinstance(body["error"]["message"], str)
    return isinstance(body["error"]["message"], str) and isinstance(body["error"]["type"], str)


@pytest.mark.parametrize("path", JSON_ENDPOINTS)
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_10_mb_body_is_a_413_in_the_apis_shape(path: str, declared: bool) -> None:
    app, transport = make_app()
    body = b'{"model": "' + b"x" * TEN_MB + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 1 << 20):
            yield body[i:i + (1 << 20)]

    async with client(app) as c:
        resp = await c.post(path, content=body if declared else chunks(),
                            headers={"content-type": "application/json"})
    assert resp.status_code == 413, resp.text[:300]
    assert shape_ok(path, resp.json())
    assert transport.calls == []


# ---- the profiler's bad input: 4xx, never a 5xx --------------------------------------------------

@pytest.mark.parametrize(("body", "status", "words"), [
    (b"{bad", 400, "malformed JSON"),
    (b"[]", 400, "JSON object"),
    (b'{"workers": "w1"}', 400, "list"),
    (b'{"workers": []}', 400, "non-empty"),
    (b'{"workers": [1]}', 400, "list"),
    (b'{"workers": ["nobody", "nobody-else"]}', 404, "none of the workers"),
    (b'{"x": "' + b"y" * 70_000 + b'"}', 413, "exceeds"),
])
async def test_profiler_bad_input_is_a_4xx(body: bytes, status: int, words: str) -> None:
    app, _ = make_app()
    async with client(app) as c:
        resp = await c.post("/v1/admin/profile/start", content=body)
    assert resp.status_code == status and words in resp.json()["error"]["message"]


@pytest.fixture
async def refusing_engine() -> AsyncIterator[str]:
    """A stand-in engine on 127.0.0.1 whose profiler refuses every call with a 400."""
    async def refuse(_: web.Request) -> web.Response:
        return web.json_response({"error": "a profile is already running"}, status=400)

    server = web.Application()
    server.router.add_post("/start_profile", refuse)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    await runner.cleanup()


async def test_when_every_engine_refuses_the_profiler_answers_their_4xx(refusing_engine: str) -> None:
    app, _ = make_app(worker("w1").model_copy(update={"http_url": refusing_engine}),
                      worker("w2").model_copy(update={"http_url": refusing_engine}))
    async with client(app) as c:
        resp = await c.post("/v1/admin/profile/start", json={})
    assert resp.status_code == 400 and resp.json()["failed"] == 2


# ---- slow-drip clients against the deadlines ---------------------------------------------------------

@pytest.fixture
def kvd_socket(tmp_path: Path) -> Iterator[str]:
    with kvd_stub(str(tmp_path / "kvd.sock")) as path:
        yield path


@contextlib.asynccontextmanager
async def serve(app: Any, header_timeout: float, body_timeout: float) -> AsyncIterator[int]:
    """``app`` under uvicorn with the deadline protocol, on a free 127.0.0.1 port, in this event loop."""
    config = uvicorn.Config(app, http=with_deadlines(header_timeout, body_timeout), log_level="warning",
                            lifespan="off", timeout_keep_alive=5)
    async with uvicorn_port(config) as port:
        yield port


async def drip(port: int, fast: bytes, slow: bytes, every: float, bound: float) -> tuple[bytes, float]:
    """Send ``fast`` at once, then ``slow`` a byte per ``every`` seconds until the server answers or
    closes; return what came back (b"" for a close without an answer) and after how long."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    received = asyncio.ensure_future(reader.read())  # to the server's close
    try:
        writer.write(fast)
        for i in range(len(slow)):
            if received.done():
                break
            writer.write(slow[i:i + 1])
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            await asyncio.wait((received,), timeout=every)
        answer = await asyncio.wait_for(received, bound)
        return answer, time.monotonic() - started
    finally:
        writer.close()


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


async def test_slow_drip_headers_get_the_connection_closed() -> None:
    app, transport = make_app()
    async with serve(app, header_timeout=0.5, body_timeout=30) as port:
        answer, took = await drip(port, HEAD + b"x-slow: " + b"a" * 200 + b"\r\n", b"", every=0.02, bound=5)
    assert answer == b"" and 0.5 <= took < 3.0
    assert transport.calls == []


@pytest.mark.parametrize(("path", "shape"), [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")])
async def test_a_slow_drip_body_is_a_408_in_the_apis_shape(path: str, shape: str) -> None:
    app, transport = make_app()
    body = orjson.dumps(CHAT if shape == "openai" else MESSAGES)
    head = HEAD.replace(b"/v1/chat/completions", path.encode()) + f"content-length: {len(body)}\r\n\r\n".encode()
    async with serve(app, header_timeout=30, body_timeout=0.5) as port:
        answer, took = await drip(port, head, body, every=0.05, bound=5)
        # the server still serves everyone else
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
    status, _, payload = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408") and b"connection: close" in status.lower()
    error = orjson.loads(payload)
    assert (error["type"] == "error" and error["error"]["type"] == "timeout_error") if shape == "anthropic" \
        else error["error"]["code"] == 408
    assert 0.5 <= took < 3.0
    assert len(transport.calls) == 1  # only the bystander's request reached a worker


async def test_deadlines_never_cut_a_long_answer_or_a_kept_alive_connection() -> None:
    async def slow(request: Request) -> Response:
        await request.body()

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(8):
                await asyncio.sleep(0.1)
                yield b"data: x\n\n"
        return StreamingResponse(chunks(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/slow", slow, methods=["POST"])])
    async with serve(app, header_timeout=0.3, body_timeout=0.3) as port, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        first = await c.post("/slow", content=b"{}")  # streams for ~0.8 s, past both deadlines
        await asyncio.sleep(0.5)  # idle on the kept-alive connection past the header deadline
        second = await c.post("/slow", content=b"{}")
    assert first.text == second.text == "data: x\n\n" * 8


async def test_a_prewarm_hints_at_most_the_workers_device_capacity(kvd_socket: str) -> None:
    from infera.kv.tokenizer import PromptRenderer
    from infera.protocols.worker import Capacity

    small = worker("w1").model_copy(update={"capacity": Capacity(kv_blocks=4)})
    router = Router(FakeFleet(small), FakeTransport(), None, PromptRenderer.byte_level(),
                    RouterOptions(policy="round-robin"), rng=random.Random(1))
    app = build_app(router, max_body_bytes=64 * 1024, strip_patterns=[])
    install_operations(app, router, strip_patterns=[], kvd_socket_path=kvd_socket)
    async with client(app) as c:
        resp = await c.post("/v1/cache/prewarm", json={"model": MODEL, "prompt": "p" * 500, "worker": "w1"})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["blocks"] == 4 and body["prompt_blocks"] == 500 // 16
