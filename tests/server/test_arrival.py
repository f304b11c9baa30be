"""An incoming request's parse callbacks (``infera.server.arrival``) and the lean path's start at the end of the
headers (``LeanHttpToolsProtocol.on_headers_complete``) leave what uvicorn's own callbacks under the deadlines'
protocol left: the same scope, the same cycle, the same bytes written, the same timers and pipeline, for every
request fed in any split into reads, hot or not, well-formed or not."""

from __future__ import annotations

import asyncio
import ctypes
from typing import Any

import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from harness.memsock import MemTransport
from infera.server.arrival import ArrivalHttpToolsProtocol, header_sink
from infera.server.deadlines import DeadlineHttpToolsProtocol, with_deadlines
from infera.server.drain import DrainState
from infera.server.lean import LeanPath, with_lean
from infera.server.relay import DISCONNECTS

HOT = "/v1/chat/completions"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'

needs_sink = pytest.mark.skipif(header_sink() is None, reason="the C extension is not built")


# --- the header sink against uvicorn's on_header -------------------------------------------------------------

NAMES = st.one_of(st.binary(max_size=12), st.sampled_from([b"Expect", b"EXPECT", b"expect", b"Content-Type",
                                                           b"x-request-id", b"X-Request-ID", b"\xc3\x89t\xe9"]))
VALUES = st.one_of(st.binary(max_size=16), st.sampled_from([b"100-continue", b"100-Continue", b"100-CONTINUE \t",
                                                            b" 100-continue", b"100-continue\t\t", b"100-continu",
                                                            b"a b \t ", b"\t", b""]))


@needs_sink
@given(st.lists(st.tuples(NAMES, VALUES), max_size=12))
def test_the_header_sink_keeps_what_uvicorns_on_header_keeps(fields: list[tuple[bytes, bytes]]) -> None:
    uvicorns: Any = HttpToolsProtocol.__new__(HttpToolsProtocol)
    uvicorns.headers = []
    uvicorns.expect_100_continue = False
    sink = header_sink()
    sink.headers = kept = []
    for name, value in fields:
        HttpToolsProtocol.on_header(uvicorns, name, value)
        assert sink(name, value) is None
    assert kept == uvicorns.headers
    assert all(type(n) is bytes and type(v) is bytes for n, v in kept)
    assert sink.expect is uvicorns.expect_100_continue


BYTE_VALUES = bytes(range(256))


@needs_sink
def test_a_one_letter_name_is_lowered_in_a_new_object_not_in_pythons_shared_one_byte_bytes() -> None:
    """BYTE_VALUES[68:69] and every other one-byte bytes object is CPython's one shared object per byte value: lowering
    a one-letter name in place turned b"D" into b"d" for the whole process (tests/server/test_tally.py's
    test_byte_by_byte then missed "[DONE]" after test_the_header_sink_keeps_what_uvicorns_on_header_keeps drew
    b"D", b"O", b"N" or b"E" as a name). A shared object found changed is put back, so a failure here stays here."""
    sink = header_sink()
    sink.headers = kept = []
    changed = []
    for c in range(ord("A"), ord("Z") + 1):
        sink(bytes([c]), b"v")
        shared = BYTE_VALUES[c:c + 1]
        if shared[0] != c:
            changed.append(chr(c))
            ctypes.memset(id(shared) + bytes.__basicsize__ - 1, c, 1)  # ob_sval[0], back as it was
    assert not changed, f"the shared one-byte bytes of {changed} were lowered in place"
    assert kept == [(bytes([c]), b"v") for c in range(ord("a"), ord("z") + 1)]


@needs_sink
def test_the_header_sink_refuses_what_httptools_never_gives() -> None:
    sink = header_sink()
    with pytest.raises(TypeError):
        sink("name", b"value")
    with pytest.raises(TypeError):
        sink(b"name")
    sink.headers = ()
    with pytest.raises(TypeError):
        sink(b"name", b"value")


# --- the protocol against uvicorn's under the deadlines' -----------------------------------------------------

class Writes(MemTransport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.upgraded: str | None = None

    def sent(self, data: bytes) -> None:
        self.written.append(data)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.upgraded = type(protocol).__name__


class Recorded(LeanPath):
    """A lean path that notes each request it is given and answers none (the next one stays pipelined)."""

    started: list[RequestResponseCycle]

    async def run(self, cycle: RequestResponseCycle) -> None:
        self.started.append(cycle)
        await asyncio.get_running_loop().create_future()  # until cancelled


def built(lean: bool, *, root_path: str = "", limit: int | None = None) -> tuple[Any, list[Any], Writes]:
    """A protocol over an in-memory transport, and the list of the request cycles it starts (lean or ASGI):
    ``lean`` the server's class (arrival's callbacks, the lean path), else the deadlines' protocol on uvicorn's."""
    started: list[Any] = []

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        started.append(receive.__self__)  # the cycle whose receive it is
        await asyncio.get_running_loop().create_future()  # no answer: until cancelled

    path = Recorded(asgi, {HOT: asgi, "/v1/completions": asgi}, DrainState(),  # type: ignore[arg-type]
                    on_error=lambda request, exc: None,  # type: ignore[arg-type,return-value]
                    telemetry=None, default_worker=None)
    path.started = started
    cls = with_lean(with_deadlines(10, 60), path) if lean else with_deadlines(10, 60)
    config = uvicorn.Config(asgi, http=cls, log_level="critical", lifespan="off", proxy_headers=False,
                            root_path=root_path, limit_concurrency=limit)
    config.load()
    protocol = cls(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    transport = Writes()
    protocol.connection_made(transport)
    return protocol, started, transport


def seen(protocol: Any, started: list[Any], transport: Writes) -> dict[str, Any]:
    """What a request's parse left, comparable across the two protocols."""
    cycles = []
    for cycle in started:
        scope = {k: v for k, v in cycle.scope.items() if k != DISCONNECTS}
        cycles.append((scope, cycle.keep_alive, cycle.waiting_for_100_continue, bytes(cycle.body), cycle.more_body,
                       cycle.disconnected, cycle.response_started, cycle.message_event.is_set()))
    return {"cycles": cycles, "written": b"".join(transport.written), "closing": transport.is_closing(),
            "upgraded": transport.upgraded,
            "pipeline": [(c.scope.get("path"), c.scope["headers"]) for c, _ in protocol.pipeline],
            "timers": (protocol._header_timer is not None, protocol._body_timer is not None),
            "state": (protocol._in_headers, protocol._in_body, protocol.flow.read_paused)}


def post(target: bytes, *extra: bytes, body: bytes = BODY, version: bytes = b"1.1") -> bytes:
    head = [b"POST " + target + b" HTTP/" + version, b"Host: x", b"Content-Type: application/json ",
            b"content-length: " + str(len(body)).encode(), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


STREAMS = {
    "hot": post(HOT.encode()),
    "hot, header case and duplicates": post(HOT.encode(), b"X-Request-ID: one", b"x-request-id: two \t",
                                            b"ACCEPT: */*", b"accept: text/plain"),
    "hot, an empty value": post(HOT.encode(), b"x-empty:"),
    "the other hot route": post(b"/v1/completions"),
    "a query": post(HOT.encode() + b"?a=1"),
    "an empty query": post(HOT.encode() + b"?"),
    "an escape": post(b"/v1/chat/%63ompletions"),
    "absolute form": post(b"http://x" + HOT.encode()),
    "a fragment": post(HOT.encode() + b"#x"),
    "not hot": post(b"/v1/models"),
    "a trailing slash": post(HOT.encode() + b"/"),
    "get": b"GET " + HOT.encode() + b" HTTP/1.1\r\nhost: x\r\n\r\n",
    "head": b"HEAD " + HOT.encode() + b" HTTP/1.1\r\nhost: x\r\n\r\n",
    "put": post(HOT.encode()).replace(b"POST", b"PUT", 1),
    "http/1.0": post(HOT.encode(), version=b"1.0"),
    "http/1.0 keep-alive": post(HOT.encode(), b"connection: keep-alive", version=b"1.0"),
    "connection close": post(HOT.encode(), b"Connection: close"),
    "expect 100-continue": post(HOT.encode(), b"Expect: 100-Continue"),
    "expect something else": post(HOT.encode(), b"expect: 200-ok"),
    "chunked": b"POST " + HOT.encode() + b" HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n",
    "no body": post(HOT.encode(), body=b""),
    "a large body": post(HOT.encode(), body=b"x" * 70000),
    "a websocket upgrade": post(HOT.encode(), b"connection: upgrade", b"upgrade: websocket"),
    "an h2c upgrade": post(HOT.encode(), b"connection: Upgrade, HTTP2-Settings", b"upgrade: h2c"),
    "malformed header": post(HOT.encode(), b"bad header"),
    "malformed request line": b"POST " + HOT.encode() + b" HTTX/1.1\r\nhost: x\r\n\r\n",
    "a bad content length": post(HOT.encode(), b"content-length: 5"),
    "pipelined": post(HOT.encode(), b"x-request-id: 1") + post(b"/v1/completions") + post(HOT.encode() + b"?q")
                 + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
    "pipelined, a partial second": post(HOT.encode()) + post(HOT.encode())[:40],
    "headers only, no end": post(HOT.encode()).split(b"\r\n\r\n")[0],
    "half the body": post(HOT.encode())[:-10],
}


async def feed(lean: bool, reads: list[bytes], **config: Any) -> dict[str, Any]:
    protocol, started, transport = built(lean, **config)
    for data in reads:
        if transport.is_closing():
            break
        protocol.data_received(data)
    await asyncio.sleep(0)  # the started tasks take their first step (the stubs note their cycle there)
    await asyncio.sleep(0)
    got = seen(protocol, started, transport)
    protocol.connection_lost(None)
    for task in list(protocol.tasks):
        task.cancel()
    await asyncio.gather(*protocol.tasks, return_exceptions=True)
    return got


def split(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts})
    return [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True) if raw[a:b]]


@pytest.mark.parametrize("name", list(STREAMS))
@pytest.mark.parametrize("config", [{}, {"root_path": "/api"}, {"limit": 100}], ids=["plain", "root", "limit"])
async def test_every_request_is_parsed_as_uvicorn_parses_it(name: str, config: dict[str, Any]) -> None:
    raw = STREAMS[name]
    for reads in ([raw], [bytes([b]) for b in raw[:300]] + [raw[300:]], split(raw, [17, 60, 151, 152, 400])):
        lean = await feed(True, reads, **config)
        assert lean == await feed(False, reads, **config), (name, [len(r) for r in reads])


async def test_a_hot_request_takes_the_lean_path_and_the_rest_uvicorns() -> None:
    protocol, started, _ = built(True)
    protocol.data_received(post(HOT.encode()))
    await asyncio.sleep(0)
    [cycle] = started
    assert DISCONNECTS in cycle.scope  # started by the lean path
    protocol, started, _ = built(True)
    protocol.data_received(post(HOT.encode() + b"?a=1"))
    await asyncio.sleep(0)
    [cycle] = started
    assert DISCONNECTS in cycle.scope and cycle.scope["query_string"] == b"a=1"  # through _start_asgi_task
    protocol, started, _ = built(True, root_path="/api")
    protocol.data_received(post(b"/api" + HOT.encode()))
    await asyncio.sleep(0)
    assert [c.scope["path"] for c in started] == ["/api/api" + HOT]  # uvicorn's root path, not hot


@needs_sink
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(STREAMS)), cuts=st.lists(st.integers(0, 10**6), max_size=6))
async def test_any_split_into_reads_is_parsed_as_uvicorn_parses_it(name: str, cuts: list[int]) -> None:
    reads = split(STREAMS[name], cuts)
    assert await feed(True, reads) == await feed(False, reads)


def test_the_servers_protocol_has_the_arrival_callbacks() -> None:
    cls = with_lean(with_deadlines(10, 60), None)
    assert issubclass(cls, ArrivalHttpToolsProtocol) and issubclass(cls, DeadlineHttpToolsProtocol)


async def test_a_body_read_in_one_piece_is_kept_as_it_came_and_more_pieces_are_appended() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 20000 + b'"}]}'
    raw = post(HOT.encode(), body=body)
    for size, kind in ((len(raw), bytes), (7000, bytearray)):
        protocol, _, _ = built(True)
        for at in range(0, len(raw), size):
            protocol.data_received(raw[at:at + size])
        # one piece: the bytes httptools made, not a copy in a bytearray; several: appended to one bytearray
        assert type(protocol.cycle.body) is kind and protocol.cycle.body == body
        protocol.connection_lost(None)
        for task in list(protocol.tasks):
            task.cancel()
        await asyncio.gather(*protocol.tasks, return_exceptions=True)
