"""A lean stream's start written with its first chunk by the relay's writer (``CycleWriter.start``): the bytes the
sends wrote (uvicorn's head, the request id's header, the head held for the first chunk), in one write, with no
``HeadHold``; what it declines goes through the sends as before."""

from __future__ import annotations

import re
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE

from infera.router.router import RoutedResponse
from infera.server import lean
from infera.server.coalesce import hold_heads
from infera.server.relay import SseRelay, worker_headers, worker_raw_headers
from infera.server.splice import NAME_BYTES, VALUE_BYTES, CycleWriter
from tests.server.test_lean import STREAM, _writes_of, post

DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")


def declined(self: CycleWriter, *args: Any) -> bool:
    return self._decline()  # the sends' way: uvicorn's head, held for the first chunk


REQUESTS = {
    "keep-alive": post("/v1/chat/completions", STREAM, b"x-request-id: mine-1"),
    "made-up id": post("/v1/chat/completions", STREAM),
    "connection close": post("/v1/chat/completions", STREAM, b"x-request-id: mine-2", b"connection: close"),
    "http/1.0": post("/v1/chat/completions", STREAM, b"x-request-id: mine-3").replace(b"HTTP/1.1", b"HTTP/1.0", 1),
}


@pytest.mark.parametrize("name", list(REQUESTS))
async def test_a_streams_start_with_its_first_chunk_is_the_bytes_the_sends_wrote(name: str,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    raw = REQUESTS[name]
    holds: list[object] = []

    def counted(cycle: Any, loop: Any) -> None:
        holds.append(cycle)
        hold_heads(cycle, loop)
    monkeypatch.setattr(lean, "hold_heads", counted)
    direct = await _writes_of(raw)
    assert holds == []  # no HeadHold: the head went out with the first chunk, one write
    assert direct[0].startswith(b"HTTP/1.1 200 OK") and b"\r\n\r\n" in direct[0] and b"data: " in direct[0]
    monkeypatch.setattr(CycleWriter, "start", declined)
    sent = await _writes_of(raw)
    assert len(holds) == 1
    if name == "made-up id":
        direct, sent = [[re.sub(rb"x-request-id: [^\r]*", b"x-request-id: *", w) for w in ws] for ws in (direct, sent)]
    assert [DATE.sub(b"\r\n", w) for w in direct] == [DATE.sub(b"\r\n", w) for w in sent]


@given(st.lists(st.binary(max_size=12), min_size=1, max_size=8))
def test_the_joined_byte_checks_refuse_what_uvicorns_regexes_refuse(parts: list[bytes]) -> None:
    joined = b"a".join(parts)
    assert (len(joined.translate(None, NAME_BYTES)) != len(joined)) == any(HEADER_RE.search(p) for p in parts)
    assert (len(joined.translate(None, VALUE_BYTES)) != len(joined)) == any(HEADER_VALUE_RE.search(p) for p in parts)


def _cycle(**kw: Any) -> Any:
    writes: list[bytes] = []
    base = dict(response_started=False, response_complete=False, disconnected=False, keep_alive=True,
                scope={"method": "POST"}, flow=types.SimpleNamespace(write_paused=False), access_log=False,
                default_headers=[(b"server", b"uvicorn")], transport=types.SimpleNamespace(write=writes.append),
                waiting_for_100_continue=False, chunked_encoding=None)
    return types.SimpleNamespace(**{**base, **kw}), writes


@pytest.mark.parametrize("case", ["closing", "no body", "paused", "head", "error", "length", "connection", "bad value"])
def test_what_the_start_declines_is_left_to_the_sends_with_the_hold_on(case: str) -> None:
    cycle, writes = _cycle(**({"flow": types.SimpleNamespace(write_paused=True)} if case == "paused" else
                              {"scope": {"method": "HEAD"}} if case == "head" else {}))
    held: list[object] = []
    writer = CycleWriter(cycle, None, b"rid", case == "closing", held.append)
    headers = {"length": [(b"content-length", b"3")], "connection": [(b"Connection", b"keep-alive")],
               "bad value": [(b"x-a", b"a\nb")]}.get(case, [(b"content-type", b"text/event-stream")])
    started = writer.start(500 if case == "error" else 200, headers, b"" if case == "no body" else b"data: x\n\n",
                           True)
    assert (started, writes, held, cycle.response_started) == (False, [], [cycle], False)


def test_a_relays_raw_headers_are_starlettes_for_the_workers_headers() -> None:
    for prefill in ("", "p1"):
        routed = RoutedResponse.__new__(RoutedResponse)
        routed.worker_id, routed.prefill_worker_id, routed.status = "w1", prefill, 200
        relay = SseRelay(routed, None, "/v1/chat/completions", 0.0, worker_raw_headers(routed),  # type: ignore[arg-type]
                         lambda exc: b"", lambda gap: None, lambda outcome: None)
        reference = Response(media_type="text/event-stream")
        del reference.body  # a relay has none (no content-length)
        reference.init_headers({"cache-control": "no-cache", **worker_headers(routed)})
        assert relay.raw_headers == reference.raw_headers
