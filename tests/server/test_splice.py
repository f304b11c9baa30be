"""A streamed answer spliced from the upstream connection's callback to the client's transport
(:mod:`infera.server.splice`, ``BodyReader.pipe``): the same bytes and outcomes as the coroutine relay,
the upstream paused while the client reads slowly, closed when the client leaves."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera.protocols.worker import WorkerRecord
from infera.router.router import Router, RouterOptions
from infera.server import lean
from infera.server.app import build_app, install_operations
from infera.server.hot_routes import InferaApp
from infera.server.relay import SseRelay
from infera.server.splice import CycleWriter
from infera.transport.http import HttpTransport
from tests.fakes import MODEL, FakeFleet
from tests.server.test_lean import exchange, post, read_response, serve

STREAM = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True})
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
Upstream = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Unspliced(CycleWriter):
    """The writer declining every body: the relay takes its coroutine path (the reference)."""

    def ready(self) -> bool:
        return False


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)


def chunked(piece: bytes) -> bytes:
    return b"%x\r\n" % len(piece) + piece + b"\r\n"


@contextlib.asynccontextmanager
async def frontend(handle: Upstream, idle_timeout: float = 0.0) -> AsyncIterator[tuple[int, HttpTransport]]:
    """The lean frontend (uvicorn in this loop) over the real HTTP transport to one upstream served by ``handle``."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    transport = HttpTransport(connect_timeout=2, first_byte_timeout=5, idle_timeout=idle_timeout)
    await transport.start()
    fleet = FakeFleet(WorkerRecord(instance_id="w1", model=MODEL, http_url=url))
    options = RouterOptions(mode="auto", policy="round-robin")
    router = Router(fleet, transport, None, None, options, rng=random.Random(1))
    app = build_app(router, max_body_bytes=1 << 16, strip_patterns=[])
    install_operations(app, router, strip_patterns=[])
    assert isinstance(app, InferaApp)
    try:
        async with serve(app, lean=True) as port:
            yield port, transport
    finally:
        await transport.stop()
        server.close()


async def outcomes(port: int, requests: int = 1) -> dict[str, float]:
    """The frontend's request counts by status, and its workers' in-flight total, once ``requests`` have been
    counted and nothing is in flight (a relay counts its request when the upstream's body has ended, which may
    be after the client has its answer), or as they are after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        counts = await _outcomes(port)
        if sum(v for k, v in counts.items() if k != "in_flight") >= requests and not counts["in_flight"]:
            return counts
        if time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.01)


async def _outcomes(port: int) -> dict[str, float]:
    [(_, _, text)] = await exchange(port, b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
    counts: dict[str, float] = {}
    for m in re.finditer(rb'infera_requests_total\{endpoint="/v1/chat/completions",status="([^"]+)"\} (\S+)', text):
        counts[m[1].decode()] = float(m[2])
    [(_, _, workers)] = await exchange(port, b"GET /v1/workers HTTP/1.1\r\nhost: x\r\n\r\n")
    counts["in_flight"] = sum(w["in_flight"] for w in orjson.loads(workers)["data"])
    return counts


async def until(check: Callable[[], bool], bound: float = 10.0) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# ---- the splice answers as the coroutine relay does --------------------------------------------

def event(i: int, text: str) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                                     "choices": [{"index": 0, "delta": {"content": text}}]}) + b"\n\n"


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"cached_tokens":2}}\n\n'


Script = tuple[list[bytes], list[bool], str]


def scripts() -> st.SearchStrategy[Script]:
    """An SSE body split at random points into the upstream's writes, whether each write waits a moment
    after it (a socket read of its own) or goes with the next (several body pieces in one read), and how the
    upstream ends the body."""
    @st.composite
    def build(draw: st.DrawFn) -> Script:
        texts = draw(st.lists(st.text(min_size=0, max_size=12), min_size=0, max_size=12))
        body = b"".join(event(i, t) for i, t in enumerate(texts))
        if draw(st.booleans()):
            body += draw(st.sampled_from([USAGE, b'data: {"usage": null}\n\n']))
        end = draw(st.sampled_from(["done", "done", "no-done", "cut"]))
        if end == "done":
            body += b"data: [DONE]\n\n"
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=8))))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if body[a:b]]
        pieces = pieces or [b"data: x\n\n"]
        pauses = draw(st.lists(st.booleans(), min_size=len(pieces), max_size=len(pieces)))
        return pieces, pauses, end
    return build()


Answer = tuple[int, dict[bytes, bytes], bytes, dict[str, float]]


async def answer(pieces: list[bytes], pauses: list[bool], end: str, spliced: bool) -> Answer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD)
        for piece, pause in zip(pieces, pauses, strict=True):
            writer.write(chunked(piece))
            if pause:
                await writer.drain()
                await asyncio.sleep(0.001)  # a socket read of its own, most of the time
        if end == "cut":
            writer.transport.abort()
            return
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # the frontend may keep the connection: wait for it to go

    writer = CycleWriter if spliced else Unspliced
    original = lean.CycleWriter
    lean.CycleWriter = writer  # type: ignore[misc]
    try:
        async with frontend(handle) as (port, _):
            [(status, headers, body)] = await exchange(port, post("/v1/chat/completions", STREAM))
            counts = await outcomes(port)
    finally:
        lean.CycleWriter = original  # type: ignore[misc]
    headers.pop(b"date", None)
    headers.pop(b"x-request-id", None)
    return status, headers, body, counts


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts())
def test_a_spliced_stream_answers_and_counts_as_the_coroutine_relay(script: Script) -> None:
    pieces, pauses, end = script

    async def both() -> None:
        spliced = await answer(pieces, pauses, end, spliced=True)
        reference = await answer(pieces, pauses, end, spliced=False)
        assert spliced == reference
        status, _, body, counts = spliced
        assert status == 200 and counts["in_flight"] == 0
        whole = b"".join(pieces)
        if end == "no-done":
            assert body == whole  # bytes untouched
        elif end == "done":  # the chunk with the marker ends the answer: a late "\n\n" after it is not sent
            assert whole.startswith(body) and len(whole) - len(body) <= 2
    asyncio.run(both())


async def test_the_splice_is_taken_for_a_stream_through_the_lean_path(monkeypatch: Any) -> None:
    """The property above compares two paths: make sure the first is the splice (its sink is called)."""
    sunk: list[bytes] = []
    write = CycleWriter.write

    def counted(self: CycleWriter, body: bytes, more: bool) -> bool:
        sunk.append(body)
        return write(self, body, more)
    monkeypatch.setattr(CycleWriter, "write", counted)
    script = [event(0, "a"), event(1, "b"), b"data: [DONE]\n\n"]
    status, _, body, counts = await answer(script, [True] * 3, "done", True)
    assert status == 200 and counts == {"200": 1.0, "in_flight": 0}
    assert sunk and b"".join(sunk) in body and body.endswith(b"data: [DONE]\n\n")


# ---- back-pressure: a client that reads slowly pauses the upstream -------------------------------

async def test_a_slow_client_pauses_the_upstream_and_the_frontend_holds_a_bounded_amount() -> None:
    total = 48 << 20  # far above every buffer on the way (the frontend's, the kernel's: a few MiB each)
    piece = event(0, "x" * 16000)
    sent = 0
    done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(HEAD)
        with contextlib.suppress(ConnectionError):
            while sent < total:
                writer.write(chunked(piece))
                sent += len(piece)
                await writer.drain()
            writer.write(chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
        done.set()
        await reader.read()

    async with frontend(handle) as (port, transport):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
        # a tiny receive buffer: the client's side of the socket fills fast
        writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 14)
        writer.transport.pause_reading()  # the client reads nothing for now
        writer.write(post("/v1/chat/completions", STREAM))
        pool = transport._pool
        assert pool is not None

        def upstream_paused() -> bool:
            return any(not conn._transport.is_reading() for conn in pool._all if conn._transport is not None)
        await until(upstream_paused)

        async def stalled() -> None:  # the kernel's buffers between the upstream and the frontend fill, then stop
            deadline = time.monotonic() + 20
            last = -1
            while sent != last:
                assert time.monotonic() < deadline, "the upstream was never stopped"
                last = sent
                await asyncio.sleep(0.25)
        await stalled()
        assert upstream_paused() and sent < total, (sent, total)
        held = sum(c.transport.get_write_buffer_size() for c in lean_cycles())
        assert held <= (1 << 20), held  # the frontend holds about the client's high-water mark, not the stream
        writer.transport.resume_reading()
        status, _, body = await read_response(reader)
        await asyncio.wait_for(done.wait(), 10)
        assert status == 200 and len(body) == sent + len(b"data: [DONE]\n\n")
        writer.close()
        counts = await outcomes(port)
        assert counts["200"] == 1.0 and counts["in_flight"] == 0


def lean_cycles() -> list[Any]:
    """The request cycles of the lean requests alive now (their transports, as the relay writes to them)."""
    import gc

    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    return [o for o in gc.get_objects() if isinstance(o, RequestResponseCycle) and not o.response_complete]


# ---- the client leaves mid-stream ------------------------------------------------------------------

async def test_a_client_that_leaves_mid_stream_closes_the_upstream_and_nothing_stays_in_flight() -> None:
    upstream_closed = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD)
        try:
            i = 0
            while True:  # an endless stream, a token every few ms
                writer.write(chunked(event(i, "tok")))
                await writer.drain()
                i += 1
                await asyncio.sleep(0.005)
        except ConnectionError:
            pass
        finally:
            upstream_closed.set()

    async with frontend(handle) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v1/chat/completions", STREAM))
        await reader.readuntil(b"\r\n\r\n")
        for _ in range(5):
            await reader.readuntil(b"\n\n")  # a few tokens relayed
        writer.transport.abort()
        await asyncio.wait_for(upstream_closed.wait(), 10)

        counts = await outcomes(port)
        assert counts == {"499": 1.0, "in_flight": 0}
    assert SseRelay.direct is None  # the class default: only a served relay gets a writer


# ---- the idle timeout bounds each wait of a spliced stream ----------------------------------------

async def quiet_after_first(spliced: bool) -> tuple[bytes, dict[str, float]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD + chunked(event(0, "a")))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunked(event(1, "b")))  # spliced: arrives while the relay's pipe waits
        await writer.drain()
        await reader.read()  # then nothing, until the frontend gives up

    original = lean.CycleWriter
    lean.CycleWriter = CycleWriter if spliced else Unspliced  # type: ignore[misc]
    try:
        async with frontend(handle, idle_timeout=0.3) as (port, _):
            [(status, _, body)] = await exchange(port, post("/v1/chat/completions", STREAM))
            assert status == 200
            return body, await outcomes(port)
    finally:
        lean.CycleWriter = original  # type: ignore[misc]


async def test_a_spliced_stream_quiet_past_the_idle_timeout_ends_as_the_coroutine_relays_does() -> None:
    spliced, reference = await quiet_after_first(True), await quiet_after_first(False)
    assert spliced == reference
    body, counts = spliced
    assert body.startswith(event(0, "a") + event(1, "b")) and b"sent nothing for 0.3s mid-response" in body
    assert counts == {"stream_error": 1.0, "in_flight": 0}
