"""The HTTP transport owns the first-byte deadline (headers and the first body chunk must both come in time)
and the idle timeout (a worker that stops sending mid-response fails the response, not the client's wait)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from infera.protocols.worker import WorkerRecord
from infera.transport.base import UpstreamError
from infera.transport.http import HttpTransport

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def engine(first_chunk_after: float, then_hang: float = 0.0) -> AsyncIterator[str]:
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # the headers go out at once, like an engine's SSE answer
        await asyncio.sleep(first_chunk_after)
        await resp.write(b"data: token\n\n")
        if then_hang:
            await asyncio.sleep(then_hang)  # a worker that stops answering with its socket open
            await resp.write(b"data: more\n\n")
        await resp.write_eof()
        return resp

    async for url in serve(stream):
        yield url


def sse_of(parts: list[bytes]) -> Handler:
    """An engine handler that streams ``parts`` as server-sent events, then ends the body."""

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in parts:
            await resp.write(part)
        await resp.write_eof()
        return resp

    return stream


async def serve(stream: Handler) -> AsyncIterator[str]:
    """An engine on a free 127.0.0.1 port answering /v1/chat/completions with ``stream``; yields its URL."""
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


async def read_all(idle_timeout: float, then_hang: float) -> list[bytes]:
    """The whole body of a stream whose worker goes quiet for ``then_hang`` s after its first chunk."""
    async for url in engine(0.0, then_hang):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=5, idle_timeout=idle_timeout)
        await transport.start()
        try:
            resp = await transport.send(WorkerRecord(instance_id="w", model="m", http_url=url),
                                        "/v1/chat/completions", b"{}", {})
            try:
                return [chunk async for chunk in resp.body]
            finally:
                resp.close()
        finally:
            await transport.stop()
    raise AssertionError("unreachable")


async def test_a_worker_quiet_past_the_idle_timeout_mid_stream_ends_it_with_a_504() -> None:
    with pytest.raises(UpstreamError) as exc:  # the worker would finish after 2 s: the 0.3 s timeout must fire
        await read_all(idle_timeout=0.3, then_hang=2)
    assert exc.value.status == 504 and not exc.value.before_first_byte


async def test_the_idle_timeout_also_bounds_the_first_chunk() -> None:
    async for url in engine(first_chunk_after=2):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=600, idle_timeout=0.3)
        await transport.start()
        try:
            resp = await transport.send(WorkerRecord(instance_id="w", model="m", http_url=url),
                                        "/v1/chat/completions", b"{}", {})
            with pytest.raises(UpstreamError) as exc:
                await anext(resp.body)
            resp.close()
            assert exc.value.status == 504 and exc.value.before_first_byte
        finally:
            await transport.stop()


async def test_gaps_shorter_than_the_idle_timeout_pass() -> None:
    assert b"".join(await read_all(idle_timeout=2, then_hang=0.1)) == b"data: token\n\ndata: more\n\n"


async def test_drain_and_reads_together_hand_over_every_byte_once() -> None:
    parts = [b"data: %d\n\n" % i for i in range(50)]

    stream = sse_of(parts)
    got: list[bytes] = []
    async for url in serve(stream):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=5)
        await transport.start()
        try:
            resp = await transport.send(WorkerRecord(instance_id="w", model="m", http_url=url),
                                        "/v1/chat/completions", b"{}", {})
            got = [await anext(resp.body)]
            async for chunk in resp.body:
                got += [chunk, resp.drain()]
            got.append(resp.drain())
            resp.close()
        finally:
            await transport.stop()
    assert b"".join(got) == b"".join(parts)


def whole_json(body: bytes) -> Handler:
    """An engine handler answering ``body`` whole (content-length), as a non-streamed answer is."""

    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    return answer


async def test_a_whole_answer_is_ended_once_its_first_chunk_is_read() -> None:
    body = b'{"choices": [{"message": {"content": "hi"}}]}'
    async for url in serve(whole_json(body)):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=5)
        await transport.start()
        try:
            resp = await transport.send(WorkerRecord(instance_id="w", model="m", http_url=url),
                                        "/v1/chat/completions", b"{}", {})
            got = await anext(resp.body) + resp.drain()
            assert got == body and resp.ended()
            with pytest.raises(StopAsyncIteration):  # ended: the next read has nothing
                await anext(resp.body)
            resp.close()
        finally:
            await transport.stop()


async def test_a_stream_is_not_ended_until_its_last_byte_is_read() -> None:
    parts = [b"data: %d\n\n" % i for i in range(20)]
    async for url in serve(sse_of(parts)):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=5)
        await transport.start()
        try:
            resp = await transport.send(WorkerRecord(instance_id="w", model="m", http_url=url),
                                        "/v1/chat/completions", b"{}", {})
            got = [await anext(resp.body), resp.drain()]
            while not resp.ended():  # whenever ended() is True, nothing of the body is left unread
                try:
                    got.append(await anext(resp.body))
                except StopAsyncIteration:
                    break
                got.append(resp.drain())
            assert resp.ended()
            assert b"".join(got) == b"".join(parts)
            resp.close()
        finally:
            await transport.stop()

    release = asyncio.Event()

    async def held_open(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: token\n\n")
        await release.wait()  # the worker holds the stream open until the test has looked
        await resp.write_eof()
        return resp

    async for url in serve(held_open):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=5)
        await transport.start()
        try:
            resp = await transport.send(WorkerRecord(instance_id="w", model="m", http_url=url),
                                        "/v1/chat/completions", b"{}", {})
            assert await anext(resp.body) == b"data: token\n\n"
            assert not resp.ended()
            resp.close()
        finally:
            release.set()
            await transport.stop()
