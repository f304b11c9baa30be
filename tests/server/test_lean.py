"""The hot POSTs' lean path (``infera.server.lean``) answers as the ASGI stack does, through a real
uvicorn: the same statuses, headers and bodies (request ids, errors in each API's shape, the default
worker, the drain's close), and uvicorn's own request handling (chunked bodies, 100-continue,
pipelining, keep-alive, a client that leaves)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import io
import random
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import orjson
import pytest
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from harness.memsock import MemTransport
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app, install_operations
from infera.server.deadlines import with_deadlines
from infera.server.direct import DefaultWorkerHeader
from infera.server.drain import DrainMiddleware, DrainState
from infera.server.hot_routes import InferaApp
from infera.server.lean import LeanPath, with_lean
from infera.telemetry.logs import RequestLog
from infera.telemetry.record import RequestRecord
from infera.telemetry.tracing import Telemetry
from tests.fakes import MODEL, FakeFleet, FakeTransport, worker
from tests.serving import uvicorn_port

CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
COMPLETION = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 5})
MESSAGES = orjson.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
STREAM = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True})


def make(mode: str = "auto", default_worker: str = "", admin_token: str = "",
         script: dict[str, Any] | None = None) -> tuple[InferaApp, Router, FakeTransport]:
    transport = FakeTransport(script, text="hello there")
    router = Router(FakeFleet(worker("w1"), worker("w2")), transport, None, None,
                    RouterOptions(mode=mode, policy="round-robin"), rng=random.Random(1))
    app = build_app(router, max_body_bytes=1 << 16, strip_patterns=[])
    install_operations(app, router, strip_patterns=[], admin_token=admin_token)
    if default_worker:
        app.add_middleware(DefaultWorkerHeader, worker=default_worker)
    assert isinstance(app, InferaApp)
    return app, router, transport


class Counted(LeanPath):
    runs = 0

    async def run(self, cycle: Any) -> None:
        Counted.runs += 1
        await super().run(cycle)


@contextlib.asynccontextmanager
async def serve(app: InferaApp, lean: bool, drain: DrainState | None = None) -> AsyncIterator[int]:
    """``app`` under uvicorn as ``server_for`` runs it, with or without the lean path, on a free port."""
    drain = drain or DrainState()
    path = Counted.of(app, drain) if lean else None
    assert (path is not None) == lean
    config = uvicorn.Config(DrainMiddleware(app, drain), http=with_lean(with_deadlines(10, 10), path),
                            log_level="critical", lifespan="off", timeout_keep_alive=5, proxy_headers=False)
    async with uvicorn_port(config) as port:
        yield port


async def read_response(reader: asyncio.StreamReader, no_body: bool = False) -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP/1.1 response: status, headers (lower-case names), body (content-length or chunked; none when
    ``no_body``: the answer to a HEAD)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split()[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if no_body:
        body = b""
    elif b"content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers[b"content-length"])), 10)
    elif headers.get(b"transfer-encoding") == b"chunked":
        parts = []
        while True:
            size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)).strip(), 16)
            chunk = await asyncio.wait_for(reader.readexactly(size + 2), 10)
            if size == 0:
                break
            parts.append(chunk[:-2])
        body = b"".join(parts)
    else:
        body = b""
    return status, headers, body


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = [b"POST " + path.encode() + b" HTTP/1.1", b"host: x", b"content-type: application/json",
            b"content-length: " + str(len(body)).encode(), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def exchange(port: int, raw: bytes, count: int = 1) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return [await read_response(reader, raw.startswith(b"HEAD ")) for _ in range(count)]
    finally:
        writer.close()


def comparable(answer: tuple[int, dict[bytes, bytes], bytes]) -> tuple[int, dict[bytes, bytes], Any]:
    """An answer without what differs between two runs (the date, made-up ids)."""
    status, headers, body = answer
    kept = {k: v for k, v in headers.items() if k != b"date"}
    if kept.get(b"x-request-id", b"").startswith(b"req_"):
        kept[b"x-request-id"] = b"req_*"
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return status, kept, body
    if isinstance(data, dict):
        data.pop("id", None)
        data.pop("created", None)
        if str(data.get("request_id", "")).startswith("req_"):
            data["request_id"] = "req_*"
    return status, kept, data


CASES = [
    ("chat", post("/v1/chat/completions", CHAT)),
    ("completion", post("/v1/completions", COMPLETION)),
    ("messages", post("/v1/messages", MESSAGES)),
    ("client id kept", post("/v1/chat/completions", CHAT, b"x-request-id: mine-1")),
    ("bad id replaced", post("/v1/chat/completions", CHAT, b"x-request-id: a b")),
    ("unknown model", post("/v1/chat/completions", orjson.dumps({"model": "nope", "messages": []}))),
    ("malformed json", post("/v1/chat/completions", b"{nope")),
    ("anthropic error gets the id", post("/v1/messages", b"{nope", b"x-request-id: mine-2")),
    ("anthropic schema error", post("/v1/messages", orjson.dumps({"model": MODEL}))),
    ("too large", post("/v1/chat/completions", b"x" * (1 << 17))),
    ("direct: unknown worker", post("/v1/chat/completions", CHAT, b"x-worker-instance-id: w9")),
    ("stream", post("/v1/chat/completions", STREAM)),
    ("http/1.0", post("/v1/chat/completions", CHAT).replace(b"HTTP/1.1", b"HTTP/1.0", 1)),
    ("connection close", post("/v1/chat/completions", CHAT, b"connection: close")),
    ("chunked body", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
     + b"%x\r\n" % 10 + CHAT[:10] + b"\r\n" + b"%x\r\n" % (len(CHAT) - 10) + CHAT[10:] + b"\r\n0\r\n\r\n"),
    ("too large, chunked", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
     + b"%x\r\n" % (1 << 17) + b"x" * (1 << 17) + b"\r\n0\r\n\r\n"),
    ("not hot: get", b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n"),
    ("not hot: head", b"HEAD /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n"),
    ("not hot: malformed", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n"),
    ("a query", post("/v1/chat/completions?a=1", CHAT)),
    ("an escape", post("/v1/chat/%63ompletions", CHAT)),
    ("header case and duplicates", post("/v1/chat/completions", CHAT, b"X-Request-ID: Mine-3 \t",
                                        b"x-request-id: mine-4", b"X-Worker-Instance-Id: w9")),
]


@pytest.mark.parametrize("mode", ["auto", "direct"])
async def test_every_answer_is_the_asgi_stacks(mode: str) -> None:
    answers: dict[bool, list[Any]] = {}
    for lean in (False, True):
        app, _, _ = make(mode=mode)
        Counted.runs = 0
        async with serve(app, lean) as port:
            answers[lean] = [comparable((await exchange(port, raw))[0]) for _, raw in CASES]
        hot = [name for name, _ in CASES if not name.startswith("not hot")]
        assert Counted.runs == (len(hot) if lean else 0)  # every well-formed POST to a hot route took it
    for (name, _), asgi, lean_answer in zip(CASES, answers[False], answers[True], strict=True):
        assert lean_answer == asgi, name
    by_name = dict(zip([n for n, _ in CASES], answers[True], strict=True))
    assert by_name["client id kept"][1][b"x-request-id"] == b"mine-1"
    assert by_name["anthropic error gets the id"][2]["request_id"] == "mine-2"
    assert by_name["http/1.0"][1][b"connection"] == b"close"


async def test_a_whole_body_is_taken_without_receive_and_a_late_one_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    receives = 0
    receive = RequestResponseCycle.receive

    async def counted(self: RequestResponseCycle) -> Any:
        nonlocal receives
        receives += 1
        return await receive(self)

    monkeypatch.setattr(RequestResponseCycle, "receive", counted)
    app, _, transport = make()
    async with serve(app, True) as port:
        [(status, _, body)] = await exchange(port, post("/v1/chat/completions", CHAT))
        assert (status, receives) == (200, 0) and b"hello there" in body
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = post("/v1/chat/completions", CHAT)
        writer.write(raw[:-10])
        deadline = time.monotonic() + 10
        while not receives:  # the handler waits for the rest of its body in receive()
            assert time.monotonic() < deadline, "the handler did not start"
            await asyncio.sleep(0.01)
        writer.write(raw[-10:])
        status, _, body = await read_response(reader)
        writer.close()
    assert status == 200 and b"hello there" in body
    assert [call.body for call in transport.calls] == [orjson.loads(CHAT)] * 2


async def test_the_default_worker_and_the_forwarded_id() -> None:
    app, _, transport = make(mode="direct", default_worker="w2")
    async with serve(app, True) as port:
        [(status, headers, _)] = await exchange(port, post("/v1/chat/completions", CHAT))
        [(status2, headers2, _)] = await exchange(port, post("/v1/chat/completions", CHAT,
                                                             b"x-worker-instance-id: w1"))
    assert (status, headers[b"x-infera-worker"], status2, headers2[b"x-infera-worker"]) == (200, b"w2", 200, b"w1")
    assert transport.calls[0].headers["x-request-id"] == headers[b"x-request-id"].decode()


async def test_pipelined_and_kept_alive_requests_are_answered_in_order() -> None:
    app, _, _ = make()
    async with serve(app, True) as port:
        raw = post("/v1/chat/completions", CHAT, b"x-request-id: one") + post("/v1/messages", MESSAGES,
                                                                              b"x-request-id: two")
        answers = await exchange(port, raw + post("/v1/completions", COMPLETION, b"x-request-id: three"), 3)
    assert [(s, h[b"x-request-id"]) for s, h, _ in answers] == [(200, b"one"), (200, b"two"), (200, b"three")]
    assert all(b"connection" not in h for _, h, _ in answers)


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    app, _, _ = make()
    async with serve(app, True) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = post("/v1/chat/completions", CHAT, b"expect: 100-continue")
        writer.write(head[:-len(CHAT)])
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        writer.write(CHAT)
        status, _, body = await read_response(reader)
        writer.close()
    assert status == 200 and b"hello there" in body


async def test_while_draining_a_hot_answer_closes_its_connection() -> None:
    app, _, _ = make()
    drain = DrainState()
    async with serve(app, True, drain) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        drain.draining = True
        writer.write(post("/v1/chat/completions", CHAT) + post("/v1/messages", MESSAGES, b"x-request-id: late"))
        status, headers, _ = await read_response(reader)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed: the pipelined one is never answered
        writer.close()
    assert (status, headers[b"connection"]) == (200, b"close")
    assert drain.quiet_for() < 10


async def test_an_unexpected_failure_is_a_500_in_the_apis_shape_and_the_connection_closes() -> None:
    app, router, _ = make()

    async def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("boom")

    router.dispatch = broken  # type: ignore[method-assign]
    async with serve(app, True) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v1/chat/completions", CHAT))
        status, headers, body = await read_response(reader)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    assert status == 500 and orjson.loads(body)["error"]["message"] == "internal error: RuntimeError"
    assert b"x-request-id" not in headers  # as the server-error middleware outside the request id answered


async def test_a_client_that_leaves_during_the_dispatch_releases_the_worker() -> None:
    app, router, transport = make(script={"w1": "hang", "w2": "hang"})
    async with serve(app, True) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v1/chat/completions", CHAT))
        await asyncio.wait_for(transport.sent.wait(), 10)
        assert sum(w.in_flight for w in router.view.workers()) == 1
        writer.close()
        deadline = time.monotonic() + 10
        while sum(w.in_flight for w in router.view.workers()):
            assert time.monotonic() < deadline, "the dispatch was not cancelled"
            await asyncio.sleep(0.01)
    requests = app.state.metrics.requests
    assert any(s.labels.get("status") == "499" and s.value == 1 for m in requests.collect() for s in m.samples)


async def test_an_app_with_a_middleware_it_does_not_know_gets_no_lean_path() -> None:
    app, _, _ = make()
    assert LeanPath.of(app, DrainState()) is not None

    class Other:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await self.app(scope, receive, send)

    app.add_middleware(Other)
    assert LeanPath.of(app, DrainState()) is None


class Recorded(Telemetry):
    """Telemetry that keeps what each request's record ended with."""

    def __init__(self) -> None:
        super().__init__(None, RequestLog("json", stream=io.BytesIO()))
        self.ended: list[tuple[str, int, int, str, str, bool]] = []

    def end(self, record: RequestRecord, path: str) -> None:
        super().end(record, path)
        rid = "req_*" if record.request_id.startswith("req_") else record.request_id
        self.ended.append((path, record.status, record.output_tokens, record.model, rid, bool(record.error)))


async def test_observe_sees_the_same_requests_on_the_lean_path() -> None:
    seen: dict[bool, list[Any]] = {}
    for lean in (False, True):
        telemetry = Recorded()
        transport = FakeTransport(None, text="hello there")
        router = Router(FakeFleet(worker("w1"), worker("w2")), transport, None, None,
                        RouterOptions(mode="auto", policy="round-robin"), rng=random.Random(1))
        app = build_app(router, max_body_bytes=1 << 16, strip_patterns=[], telemetry=telemetry)
        assert isinstance(app, InferaApp)
        async with serve(app, lean) as port:
            for i, (_, raw) in enumerate(CASES[:13]):
                await exchange(port, raw.replace(b"host: x", b"host: x\r\nx-request-id: r%d" % i, 1)
                               if b"x-request-id" not in raw else raw)
        seen[lean] = telemetry.ended
    assert seen[True] == seen[False]
    assert len(seen[True]) == 13  # every request
    assert seen[True][0][:2] == ("/v1/chat/completions", 200) and seen[True][0][3:5] == (MODEL, "r0")
    assert {s for _, s, *_ in seen[True]} >= {200, 400, 413}


async def test_an_answered_requests_objects_die_by_reference_count() -> None:
    """No reference cycle keeps a lean request's cycle, watch, response or accounting for the cyclic GC (whose
    young collections then come more often and find thousands of them): with the GC saving what it finds instead of
    freeing it, the requests answered before the last leave nothing of theirs to find."""
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as Cycle

    from infera.server.openai_api import Accounting
    from infera.server.relay import ClientWatch, Disconnects

    kinds = (Cycle, Disconnects, ClientWatch, Accounting)
    app, _, _ = make()
    async with serve(app, True) as port:
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                for body in (CHAT, STREAM, CHAT, STREAM, CHAT):  # one after the other on a kept-alive connection
                    writer.write(post("/v1/chat/completions", body))
                    assert (await read_response(reader))[0] == 200
            finally:
                writer.close()
            gc.collect()
            found = collections.Counter(type(o).__name__ for o in gc.garbage if isinstance(o, kinds))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert found == {}


class WriteSpy(MemTransport):
    """A client connection in memory that keeps every write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def sent(self, data: bytes) -> None:
        self.writes.append(data)


class Holds(LeanPath):
    """Notes the cycle's transport as each request's task starts."""

    seen: ClassVar[list[str]] = []

    async def serve(self, cycle: Any) -> None:
        Holds.seen.append(type(cycle.transport).__name__)
        await super().serve(cycle)


async def _writes_of(raw: bytes, failing_error_handler: bool = False) -> list[bytes]:
    app, router, _ = make()
    lean = Holds.of(app, DrainState())
    assert lean is not None
    if failing_error_handler:
        async def broken(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("boom")

        def no_handler(request: Any, exc: Exception) -> Any:
            raise RuntimeError("the error handler failed too")

        router.dispatch = broken  # type: ignore[method-assign]
        lean.on_error = no_handler
    config = uvicorn.Config(DrainMiddleware(app, DrainState()), http=with_lean(with_deadlines(10, 10), lean),
                            log_level="critical", lifespan="off", proxy_headers=False)
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=uvicorn.server.ServerState(), app_state={})
    spy = WriteSpy()
    protocol.connection_made(spy)
    protocol.data_received(raw)
    while protocol.tasks:
        await asyncio.gather(*protocol.tasks, return_exceptions=True)
    protocol.connection_lost(None)
    return spy.writes


async def test_a_whole_answer_is_one_write_with_no_head_hold_and_a_stream_or_500_holds_its_head() -> None:
    """A lean whole answer is written in one piece by the lean path itself: its cycle gets no ``HeadHold``
    (per request, an object and a frame per write that it would never use); a stream's head still waits for its
    first chunk, and uvicorn's own 500 (two sends) is still one write, as on the ASGI stack."""
    Holds.seen = []
    whole = await _writes_of(post("/v1/chat/completions", CHAT))
    assert len(whole) == 1 and whole[0].startswith(b"HTTP/1.1 200 OK") and b'"usage"' in whole[0]
    stream = await _writes_of(post("/v1/chat/completions", STREAM))
    assert stream[0].startswith(b"HTTP/1.1 200 OK") and b"data: " in stream[0]  # the head with the first chunk
    failed = await _writes_of(post("/v1/chat/completions", CHAT), failing_error_handler=True)
    assert len(failed) == 1 and failed[0].startswith(b"HTTP/1.1 500") and failed[0].endswith(b"Internal Server Error")
    assert Holds.seen == ["WriteSpy"] * 3  # no hold at the task's start: the stream and the 500 put one on later
