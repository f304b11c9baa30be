"""A lean whole answer's write (``LeanPath.write_now``, called without a coroutine of its own) gives the client the
bytes the write before it gave (kept here as the reference), and a client that left gets none."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE

from infera.server.drain import DrainState
from infera.server.lean import LeanPath
from infera.server.metrics import ServerMetrics
from infera.server.openai_api import Accounting
from infera.server.responses import WholeResponse
from tests.server.test_lean import make


def reference_write(cycle: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes, closing: bool) -> None:
    """The lean write of main a79d2e3 (``LeanPath.write`` after its drain), the bytes' reference."""
    if cycle.disconnected:
        return
    if cycle.response_started:
        raise RuntimeError("Unexpected ASGI message 'http.response.start' sent, after response already started.")
    content = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:
        content += (name, b": ", value, b"\r\n")
    keep_alive = cycle.keep_alive and not closing
    for name, value in headers:
        if HEADER_VALUE_RE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
        if name == b"connection":
            if closing:
                continue
            if b"close" in [token.lower().strip() for token in value.split(b",")]:
                keep_alive = False
        content += (name, b": ", value, b"\r\n")
    if not keep_alive:
        content.append(b"connection: close\r\n")
    content += (b"\r\n", body)
    cycle.waiting_for_100_continue = False
    cycle.transport.write(b"".join(content))
    cycle.response_started = True
    cycle.response_complete = True
    cycle.keep_alive = keep_alive
    cycle.message_event.set()
    if not keep_alive:
        cycle.transport.close()
    cycle.on_response()


class Transport:
    def __init__(self) -> None:
        self.log: list[bytes | str] = []

    def write(self, data: bytes) -> None:
        self.log.append(data)

    def close(self) -> None:
        self.log.append("close")


class Event:
    def __init__(self) -> None:
        self.sets = 0

    def set(self) -> None:
        self.sets += 1


class Cycle:
    """What ``write_now`` reads and sets of uvicorn's ``RequestResponseCycle``."""

    def __init__(self, defaults: list[tuple[bytes, bytes]], keep_alive: bool, disconnected: bool = False) -> None:
        self.default_headers = defaults
        self.keep_alive = keep_alive
        self.disconnected = disconnected
        self.response_started = self.response_complete = False
        self.waiting_for_100_continue = True
        self.access_log = False
        self.transport = Transport()
        self.message_event = Event()
        self.responses = 0

    def on_response(self) -> None:
        self.responses += 1

    def state(self) -> tuple[Any, ...]:
        return (self.transport.log, self.response_started, self.response_complete, self.keep_alive,
                self.waiting_for_100_continue, self.message_event.sets, self.responses)


NAMES = st.sampled_from([b"x-infera-worker", b"content-type", b"content-length", b"x-request-id", b"connection",
                         b"cache-control", b"server"])
VALUES = st.one_of(st.sampled_from([b"close", b"keep-alive", b"Keep-Alive, CLOSE", b"application/json", b"w1"]),
                   st.binary(max_size=12))  # some with a control byte: both raise the same error
HEADERS = st.lists(st.tuples(NAMES, VALUES), max_size=6)
DEFAULTS = st.lists(st.tuples(st.sampled_from([b"date", b"server", b"x-extra"]), st.binary(max_size=30)), max_size=3)
WRITE = st.tuples(st.sampled_from([200, 204, 400, 404, 429, 500, 503]), HEADERS, st.binary(max_size=64),
                  st.booleans(), st.booleans(), st.integers(0, 2))  # ..., closing, keep-alive, defaults: same/new/copy


@settings(max_examples=400, deadline=None)
@given(st.lists(WRITE, min_size=1, max_size=8), DEFAULTS)
def test_a_whole_answers_bytes_are_the_reference_writes(writes: list[Any], first: list[tuple[bytes, bytes]]) -> None:
    """One lean path over a run of answers: the server's default headers kept as the same list, replaced by a new
    list (the next second's Date) or by a copy; every answer's bytes, close and cycle state as the reference's."""
    app, _, _ = make()
    lean = LeanPath.of(app, DrainState())
    assert lean is not None
    defaults = first
    for status, headers, body, closing, keep_alive, change in writes:
        if change == 1:
            defaults = [(name, value + b"!") for name, value in defaults] or [(b"date", b"later")]
        elif change == 2:
            defaults = list(defaults)
        got, want = Cycle(defaults, keep_alive), Cycle(defaults, keep_alive)
        outcomes = []
        for cycle, write in ((got, lean.write_now), (want, reference_write)):
            try:
                write(cycle, status, list(headers), body, closing)  # type: ignore[operator]
                outcomes.append(None)
            except RuntimeError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
        assert got.state() == want.state()


def test_a_client_that_left_gets_no_write_and_its_answer_is_still_accounted() -> None:
    """The client left before its whole answer was written: nothing is written, the cycle is not marked as
    answered (uvicorn's connection_lost has ended it), and the answer's accounting still runs once."""
    app, _, _ = make()
    lean = LeanPath.of(app, DrainState())
    assert lean is not None
    metrics: ServerMetrics = app.state.metrics
    body = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}'
    response = WholeResponse(body, 200, "application/json", [(b"x-infera-worker", b"w1")])
    response.background = Accounting(metrics.accounts("/v1/chat/completions"), response, 0.0, 0.001)
    cycle = Cycle([(b"date", b"now")], True, disconnected=True)
    cycle.scope = {"path": "/v1/chat/completions"}  # type: ignore[attr-defined]
    cycle.flow = type("Flow", (), {"write_paused": False})()  # type: ignore[attr-defined]
    asyncio.run(lean.answer(cycle, response, b"req_1", False, None))  # type: ignore[arg-type]
    assert cycle.state() == ([], False, False, True, True, 0, 0)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in metrics.registry.collect() for s in family.samples}
    assert samples[("infera_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "200")))] == 1
    assert samples[("infera_tokens_total", (("endpoint", "/v1/chat/completions"), ("kind", "prompt")))] == 3


@pytest.mark.parametrize("seed", range(3))
def test_the_default_lines_follow_the_servers_list(seed: int) -> None:
    """The lines are remade whenever the server hands over another list, whatever its contents."""
    app, _, _ = make()
    lean = LeanPath.of(app, DrainState())
    assert lean is not None
    rng = random.Random(seed)
    for _ in range(20):
        defaults = [(b"date", str(rng.random()).encode())] if rng.random() < 0.7 else []
        got, want = Cycle(defaults, True), Cycle(defaults, True)
        lean.write_now(got, 200, [(b"content-length", b"0")], b"", False)  # type: ignore[arg-type]
        reference_write(want, 200, [(b"content-length", b"0")], b"", False)
        assert got.state() == want.state()
