"""The HTTP transport owns the first-byte deadline: headers and the first body chunk must both come in time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from infera.protocols.worker import WorkerRecord
from infera.transport.base import UpstreamError
from infera.transport.http import HttpTransport


async def engine(first_chunk_after: float) -> AsyncIterator[str]:
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # the headers go out at once, like an engine's SSE answer
        await asyncio.sleep(first_chunk_after)
        await resp.write(b"data: token\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def first_chunk(first_chunk_after: float, first_byte_timeout: float) -> bytes:
    async for url in engine(first_chunk_after):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=first_byte_timeout)
        await transport.start()
        try:
            resp = await transport.send(WorkerRecord(instance_id="w", model="m", http_url=url),
                                        "/v1/chat/completions", b"{}", {})
            try:
                return await anext(resp.body)
            finally:
                resp.close()
        finally:
            await transport.stop()
    raise AssertionError("unreachable")


async def test_a_first_chunk_later_than_the_first_byte_timeout_is_a_504_before_the_first_byte() -> None:
    with pytest.raises(UpstreamError) as exc:
        await first_chunk(first_chunk_after=1.0, first_byte_timeout=0.2)
    assert exc.value.status == 504 and exc.value.before_first_byte


async def test_a_first_chunk_in_time_passes() -> None:
    assert await first_chunk(first_chunk_after=0.05, first_byte_timeout=2) == b"data: token\n\n"


async def test_drain_and_reads_together_hand_over_every_byte_once() -> None:
    parts = [b"data: %d\n\n" % i for i in range(50)]

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in parts:
            await resp.write(part)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    transport = HttpTransport(connect_timeout=2, first_byte_timeout=5)
    await transport.start()
    try:
        resp = await transport.send(WorkerRecord(instance_id="w", model="m", http_url=f"http://127.0.0.1:{port}"),
                                    "/v1/chat/completions", b"{}", {})
        got = [await anext(resp.body)]
        async for chunk in resp.body:
            got += [chunk, resp.drain()]
        got.append(resp.drain())
        resp.close()
    finally:
        await transport.stop()
        await runner.cleanup()
    assert b"".join(got) == b"".join(parts)
