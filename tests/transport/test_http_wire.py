"""The request path's own HTTP/1.1 client: connections are reused only when an answer was read in
full, anything abandoned or broken is closed, and every failure is an :class:`UpstreamError` with the
status and retry flag the router relies on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.protocols.worker import WorkerRecord
from infera.transport.base import UpstreamError
from infera.transport.http import HttpTransport
from infera.transport.http_wire import Connection, Pool, Target, WireTimeout
from tests.transport.test_http import serve, sse_of

PATH = "/v1/chat/completions"


def record(url: str) -> WorkerRecord:
    return WorkerRecord(instance_id="w", model="m", http_url=url)


async def started(**kw: float) -> HttpTransport:
    transport = HttpTransport(connect_timeout=kw.get("connect_timeout", 2), first_byte_timeout=kw.get("first_byte", 5),
                              idle_timeout=kw.get("idle", 0.0))
    await transport.start()
    return transport


async def body_of(transport: HttpTransport, url: str, body: bytes = b"{}",
                  headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    resp = await transport.send(record(url), PATH, body, headers or {})
    try:
        return resp.status, resp.content_type, b"".join([chunk async for chunk in resp.body])
    finally:
        resp.close()


async def test_sequential_answers_reuse_one_connection_and_carry_the_request() -> None:
    peers: list[object] = []
    seen: list[tuple[bytes, str | None, str | None]] = []

    async def echo(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        seen.append((await request.read(), request.headers.get("x-request-id"), request.headers.get("Host")))
        return web.json_response({"n": len(seen)})

    async for url in serve(echo):
        transport = await started()
        try:
            got = [await body_of(transport, url, b'{"i": %d}' % i, {"x-request-id": f"r{i}"}) for i in range(5)]
        finally:
            await transport.stop()
    assert [g[2] for g in got] == [b'{"n": %d}' % (i + 1) for i in range(5)]
    assert all(g[0] == 200 and g[1].startswith("application/json") for g in got)
    assert [s[:2] for s in seen] == [(b'{"i": %d}' % i, f"r{i}") for i in range(5)]
    assert seen[0][2] == url.removeprefix("http://")
    assert len(set(peers)) == 1


async def test_a_streamed_answer_arrives_whole_and_in_order() -> None:
    parts = [b"data: %d\n\n" % i for i in range(200)]

    stream = sse_of(parts)
    async for url in serve(stream):
        transport = await started()
        try:
            status, ctype, body = await body_of(transport, url)
            again = await body_of(transport, url)
        finally:
            await transport.stop()
    assert status == 200 and ctype == "text/event-stream" and body == b"".join(parts) == again[2]


async def test_an_abandoned_answer_closes_its_connection_and_never_leaks_into_the_next() -> None:
    peers: list[object] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: first\n\n")
        if request.query.get("slow") is None:
            await resp.write_eof()
            return resp
        await asyncio.sleep(0.3)
        await resp.write(b"data: late\n\n")
        await resp.write_eof()
        return resp

    async for url in serve(stream):
        transport = await started()
        try:
            resp = await transport.send(record(url), PATH + "?slow=1", b"{}", {})
            assert await anext(resp.body) == b"data: first\n\n"
            resp.close()  # the client left: the rest must not reach the next request
            status, _, body = await body_of(transport, url)
        finally:
            await transport.stop()
    assert status == 200 and body == b"data: first\n\n" and len(set(peers)) == 2


Handle = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def raw_server(handle: Handle) -> AsyncIterator[str]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


async def test_a_body_without_length_ends_with_the_connection() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nhello ")
        await writer.drain()
        writer.write(b"world")
        writer.close()

    async for url in raw_server(handle):
        transport = await started()
        try:
            assert await body_of(transport, url) == (200, "text/plain", b"hello world")
        finally:
            await transport.stop()


async def test_a_server_that_hangs_up_before_answering_is_a_502_the_router_may_retry() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    async for url in raw_server(handle):
        transport = await started()
        try:
            with pytest.raises(UpstreamError) as exc:
                await transport.send(record(url), PATH, b"{}", {})
        finally:
            await transport.stop()
    assert exc.value.status == 502 and exc.value.before_first_byte and "unreachable" in str(exc.value)


async def test_a_stream_cut_mid_body_is_a_502_after_the_first_byte() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"d\r\ndata: token\n\n\r\n")
        await writer.drain()
        writer.close()

    async for url in raw_server(handle):
        transport = await started()
        try:
            resp = await transport.send(record(url), PATH, b"{}", {})
            assert await anext(resp.body) == b"data: token\n\n"
            with pytest.raises(UpstreamError) as exc:
                await anext(resp.body)
            resp.close()
        finally:
            await transport.stop()
    assert exc.value.status == 502 and not exc.value.before_first_byte


async def test_garbage_is_a_502() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SPDY/9 banana\r\n\r\n")
        await writer.drain()

    async for url in raw_server(handle):
        transport = await started()
        try:
            with pytest.raises(UpstreamError) as exc:
                await transport.send(record(url), PATH, b"{}", {})
        finally:
            await transport.stop()
    assert exc.value.status == 502 and exc.value.before_first_byte


async def test_a_refused_connection_is_a_502_and_a_5xx_answer_names_its_status() -> None:
    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=503, text="engine overloaded")

    async for url in serve(fail):
        transport = await started()
        try:
            with pytest.raises(UpstreamError) as answered:
                await transport.send(record(url), PATH, b"{}", {})
            status, _, _ = await body_of(transport, url + "/missing-prefix")
        finally:
            await transport.stop()
    assert answered.value.status == 502 and "answered 503: engine overloaded" in str(answered.value)
    assert status == 404  # a path prefix in the worker's URL is kept
    transport = await started()
    try:
        with pytest.raises(UpstreamError) as refused:
            await transport.send(record(url), PATH, b"{}", {})  # the server is gone
    finally:
        await transport.stop()
    assert refused.value.status == 502 and refused.value.before_first_byte and "unreachable" in str(refused.value)


async def test_a_request_cancelled_while_waiting_closes_its_connection() -> None:
    arrived = asyncio.Event()
    gone = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        arrived.set()  # the request is written: the client now waits for an answer that never comes
        await reader.read()  # returns when the client closes
        gone.set()

    async for url in raw_server(handle):
        transport = await started()
        try:
            task = asyncio.ensure_future(transport.send(record(url), PATH, b"{}", {}))
            await asyncio.wait_for(arrived.wait(), 2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(gone.wait(), 2)
        finally:
            await transport.stop()


async def test_no_answer_within_the_first_byte_timeout_is_a_504_and_the_connection_goes() -> None:
    gone = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()
        gone.set()

    async for url in raw_server(handle):
        transport = await started(first_byte=0.2)
        try:
            with pytest.raises(UpstreamError) as exc:
                await transport.send(record(url), PATH, b"{}", {})
            await asyncio.wait_for(gone.wait(), 2)
        finally:
            await transport.stop()
    assert exc.value.status == 504 and exc.value.before_first_byte


async def test_each_request_on_a_connection_expires_at_its_own_deadline() -> None:
    """The connection's one deadline timer outlives requests: a later deadline than the pending timer's waits
    for its own time (the timer re-arms), an earlier one is not held to the pending timer's."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    plan = [True, False, True, False]  # answer, stay silent, ...

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while plan:
            await read_request(reader)
            if plan.pop(0):
                writer.write(answer)
        await reader.read()

    loop = asyncio.get_running_loop()
    async for url in raw_server(handle):
        pool = Pool(connect_timeout=2)
        key = Target(url).key
        elapsed: list[float] = []
        for first, second in ((0.1, 0.5), (30.0, 0.2)):
            conn = await pool.connect(key)
            reader = await conn.request(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n", b"{}", loop.time() + first)
            assert await reader.readany() == b"{}"
            start = loop.time()
            with pytest.raises(WireTimeout):
                await conn.request(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n", b"{}", start + second)
            elapsed.append(loop.time() - start)
            assert conn.closed
        await pool.close()
    assert 0.45 <= elapsed[0] < 2 and 0.15 <= elapsed[1] < 2


WHOLE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"


async def until(condition: Callable[[], bool], bound: float = 2.0) -> None:
    """Yield to the loop until ``condition`` holds (at most ``bound`` seconds)."""
    async with asyncio.timeout(bound):
        while not condition():  # noqa: ASYNC110 (a protocol callback's state: no event to wait on)
            await asyncio.sleep(0)


async def test_a_whole_answer_is_handed_back_once_with_its_body_not_at_its_head() -> None:
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(WHOLE_HEAD)  # the head and the body in two writes, as uvicorn engines send them
        await writer.drain()
        await release.wait()
        writer.write(b'{"ok": true}'[:11])
        await writer.drain()
        await reader.read()

    async for url in raw_server(handle):
        transport = await started(idle=30)
        try:
            task = asyncio.ensure_future(transport.send(record(url), PATH, b"{}", {}))
            pool = transport._pool
            assert pool is not None
            def head_in(conns: set[Connection] = pool._all) -> bool:
                return any(conn.status == 200 for conn in conns)

            await until(head_in)
            for _ in range(5):
                await asyncio.sleep(0)  # turns in which a send returning at the head would have returned
            assert not task.done()
            release.set()
            resp = await task
            assert resp.drain() == b'{"ok": true'  # all of it, with no further wait
            assert [chunk async for chunk in resp.body] == []
            resp.close()
            assert len(pool._all) == 1 and not next(iter(pool._all)).closed  # read in full: kept for reuse
        finally:
            await transport.stop()


async def test_a_whole_answer_whose_body_stalls_past_the_idle_timeout_is_a_504_before_the_first_byte() -> None:
    gone = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(WHOLE_HEAD)
        await writer.drain()
        await reader.read()  # no body; returns when the client closes
        gone.set()

    async for url in raw_server(handle):
        transport = await started(first_byte=600, idle=0.3)
        try:
            with pytest.raises(UpstreamError) as exc:
                async with asyncio.timeout(5):  # the idle timeout, not the first-byte one, ends the wait
                    await transport.send(record(url), PATH, b"{}", {})
            await asyncio.wait_for(gone.wait(), 2)
        finally:
            await transport.stop()
    assert exc.value.status == 504 and exc.value.before_first_byte and "idle timeout 0.3s" in str(exc.value)


async def test_a_whole_answer_cut_after_its_head_fails_its_body_as_before() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(WHOLE_HEAD + b'{"ok"')
        await writer.drain()
        writer.close()

    async for url in raw_server(handle):
        transport = await started()
        try:
            resp = await transport.send(record(url), PATH, b"{}", {})  # the head came: the answer is the worker's
            assert resp.status == 200
            with pytest.raises(UpstreamError) as exc:
                [chunk async for chunk in resp.body]
            resp.close()
        finally:
            await transport.stop()
    assert exc.value.status == 502 and not exc.value.before_first_byte


async def test_whole_answers_keep_their_status_when_their_connection_serves_the_next_request_first() -> None:
    """A whole answer's connection goes back to the pool before its task resumes; another request may take
    it at once: each answer keeps its own status and type, and no connection is closed under another request."""
    async def answer(request: web.Request) -> web.Response:
        n = int((await request.read()) or b"0")
        ctype = "text/plain" if n % 2 else "application/json"
        return web.Response(status=200 + n % 3, body=b"x" * n, content_type=ctype)

    async def client(transport: HttpTransport, url: str, k: int) -> list[tuple[int, int, str]]:
        got = []
        for i in range(30):
            n = k * 30 + i
            resp = await transport.send(record(url), PATH, str(n).encode(), {})
            body = b"".join([chunk async for chunk in resp.body])
            resp.close()
            got.append((resp.status, len(body), resp.content_type))
        return got

    async for url in serve(answer):
        transport = await started()
        try:
            results = await asyncio.gather(*(client(transport, url, k) for k in range(8)))
        finally:
            await transport.stop()
    for k, got in enumerate(results):
        for i, (status, size, ctype) in enumerate(got):
            n = k * 30 + i
            assert (status, size) == (200 + n % 3, n)
            assert ctype.startswith("text/plain" if n % 2 else "application/json")


def test_under_uvloop_as_the_frontend_runs() -> None:
    async def both() -> None:
        await test_sequential_answers_reuse_one_connection_and_carry_the_request()
        await test_a_streamed_answer_arrives_whole_and_in_order()
        await test_an_abandoned_answer_closes_its_connection_and_never_leaks_into_the_next()
        await test_whole_answers_keep_their_status_when_their_connection_serves_the_next_request_first()
        await test_each_request_on_a_connection_expires_at_its_own_deadline()

    uvloop.run(both())


def _head_as_built_per_call(target: Target, path: str, length: int, headers: dict[str, str]) -> bytes:
    """Target.head as it was written before its start lines were kept per path."""
    lines = [b"POST ", target.prefix, path.encode(), b" HTTP/1.1\r\n", target.host_line,
             b"Content-Length: ", str(length).encode(), b"\r\n"]
    for name, value in headers.items():
        lines += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


_PATHS = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/messages", "/x", ""]) | st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12).map(lambda s: "/" + s)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["http://e:8000", "http://e:8000/base/", "https://u:p@h.example"]),
       st.lists(st.tuples(_PATHS, st.integers(min_value=0, max_value=10**7),
                          st.dictionaries(st.sampled_from(["content-type", "x-request-id", "authorization"]),
                                          st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E),
                                                  max_size=20), max_size=3)), max_size=80))
def test_a_head_is_what_building_it_whole_each_call_gives(base: str, calls: list[tuple[str, int, dict[str, str]]]
                                                          ) -> None:
    target = Target(base)
    for path, length, headers in calls:  # paths repeat: the kept start lines are reused, past the bound too
        assert target.head(path, length, headers) == _head_as_built_per_call(target, path, length, headers)
