"""An engine's answer read in one piece: the connection's own reading of a whole plain answer
(``Connection._whole``) leaves the request, its reader and the pool as httptools' callbacks leave them, for
every answer it takes, and leaves every other one to httptools untouched."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from infera.transport.http_wire import WHOLE_BYTES, Connection, WireError


class Pool:
    def __init__(self) -> None:
        self.log: list[str] = []

    def release(self, conn: Connection) -> None:
        self.log.append("release")

    def forget(self, conn: Connection) -> None:
        self.log.append("forget")


class Transport:
    def __init__(self) -> None:
        self.log: list[Any] = []

    def write(self, data: bytes) -> None:
        self.log.append(("write", data))

    def abort(self) -> None:
        self.log.append("abort")

    def pause_reading(self) -> None:
        self.log.append("pause")

    def resume_reading(self) -> None:
        self.log.append("resume")

    def get_extra_info(self, name: str) -> None:
        return None


async def _exchange(reads: list[bytes], parser_only: bool) -> tuple[Any, ...]:
    """One request on a fresh connection, answered by ``reads``: what its caller, its reader and the pool
    saw, read by the fast path where it takes the answer, or by httptools alone (``parser_only``)."""
    pool = Pool()
    conn = Connection(pool, ("e", 80, False))  # type: ignore[arg-type]
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(conn.request(b"POST / HTTP/1.1\r\n\r\n", b"{}", None, 0.0))
    await asyncio.sleep(0)
    took = []
    for data in reads:
        if conn.closed:
            break
        fed = conn._fed
        if parser_only:
            conn._fed = True
        conn.data_received(data)
        took.append(not fed and not conn._fed)
    await asyncio.sleep(0)
    if not waiting.done():
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        return ("waiting", conn.status, conn.content_type, conn.closed, pool.log, transport.log[1:]), took
    try:
        reader = waiting.result()
    except WireError as exc:
        return ("failed", str(exc), conn.closed, pool.log, transport.log[1:]), took
    return (reader.status, reader.content_type, reader.read_nowait(), reader.at_eof(), conn.body is None, conn.status,
            conn.content_type, conn._length, conn._framed, conn.closed, pool.log, transport.log[1:]), took


def _both(reads: list[bytes]) -> tuple[Any, Any, list[bool]]:
    async def run() -> tuple[Any, Any, list[bool]]:
        fast, took = await _exchange(reads, False)
        slow, _ = await _exchange(reads, True)
        return fast, slow, took
    return asyncio.run(run())


NAMES = st.sampled_from([b"content-type", b"Content-Type", b"content-length", b"Content-Length", b"date",
                         b"server", b"x-infera-worker", b"connection", b"transfer-encoding", b"keep-alive",
                         b"upgrade", b"x y", b"", b"x\x7f"])
VALUES = st.one_of(st.sampled_from([b"application/json", b"text/plain; charset=utf-8", b"close", b"keep-alive",
                                    b"chunked", b"uvicorn", b"12", b"012", b"1 2", b" 3", b"3 ", b"", b"\t4",
                                    b"caf\xc3\xa9", b"+5", b"-1"]),
                   st.binary(max_size=8))
FIELDS = st.lists(st.tuples(NAMES, st.sampled_from([b": ", b":", b":  ", b" : ", b":\t"]), VALUES), max_size=6)
STATUS_LINES = st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.1 200 ", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 500 x",
                                b"HTTP/1.1 204 No Content", b"HTTP/1.1 304 Not Modified", b"HTTP/1.1 100 Continue",
                                b"HTTP/1.0 200 OK", b"HTTP/1.1 200", b"HTTP/1.1 999 x", b"HTTP/1.1 429 Too Many"])


@st.composite
def answers(draw: st.DrawFn) -> list[bytes]:
    body = draw(st.binary(max_size=40))
    fields = draw(FIELDS)
    if draw(st.booleans()):  # most answers carry their true length
        fields.insert(draw(st.integers(0, len(fields))), (b"content-length", b": ", str(len(body)).encode()))
    head = draw(STATUS_LINES) + b"\r\n" + b"".join(n + sep + v + b"\r\n" for n, sep, v in fields) + b"\r\n"
    data = head + body + draw(st.sampled_from([b"", b"", b"", b"x", b"HTTP/1.1 200 OK\r\n"]))
    cut = draw(st.sampled_from([len(data), len(data), len(head), len(head) // 2, len(data) - 1]))
    return [data[:cut], data[cut:]] if 0 < cut < len(data) else [data]


@settings(max_examples=1500, deadline=None)
@given(answers())
def test_an_answer_taken_whole_leaves_what_the_parser_leaves(reads: list[bytes]) -> None:
    fast, slow, _ = _both(reads)
    assert fast == slow


def test_a_plain_answer_in_one_read_is_taken_whole_and_others_are_not() -> None:
    body = b'{"ok": true}'
    plain = (b"HTTP/1.1 200 OK\r\ndate: Mon\r\nserver: uvicorn\r\ncontent-length: 12\r\n"
             b"content-type: application/json\r\n\r\n" + body)
    fast, slow, took = _both([plain])
    assert took == [True] and fast == slow
    assert fast[:3] == (200, b"application/json", body) and fast[-2] == ["release"]
    for other in ([plain[:40], plain[40:]],  # the head cut short
                  [plain[:-1], plain[-1:]],  # the body not all in
                  [plain.replace(b"content-length: 12", b"transfer-encoding: chunked") + b"0\r\n\r\n"],
                  [plain.replace(b"server: uvicorn", b"connection: close")],
                  [plain.replace(b"content-length: 12", b"content-length: %d" % (WHOLE_BYTES + 1))],
                  [plain.replace(b"date: Mon", b"date:\tMon")],
                  [plain.replace(b"date: Mon", b"content-length: 12")],  # a length twice (httptools refuses it)
                  [plain.replace(b"date: Mon", b"content-length: 9")]):
        fast, slow, took = _both(other)
        assert took[0] is False and fast == slow
    twice = plain.replace(b"date: Mon", b"content-type: text/plain")  # the last content type, as on_header keeps
    fast, slow, took = _both([twice])
    assert took == [True] and fast == slow and fast[1] == b"application/json"
