"""The load tracker's C path (``LoadCell``/``LoadTicket``: one C call per begin, first token and end) against its
Python lines: every value a policy or a metric reads, and every ticket field, after any sequence of steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.load import TTFT_SAMPLES, LoadTracker, TtftSample

native = pytest.importorskip("infera.kv._native")
if not hasattr(native, "load_begin"):
    pytest.skip("the C extension was built before load_begin", allow_module_level=True)

WORKERS = ("w0", "w1", "w2")
POOL = [(h * 0x9E3779B97F4A7C15) & (2**64 - 1) for h in range(1, 40)]  # router hashes: any u64

step = st.one_of(
    st.tuples(st.just("begin"), st.integers(0, 2), st.integers(0, 3000), st.lists(st.integers(0, 38), max_size=8),
              st.integers(0, 5)),
    st.tuples(st.just("first"), st.integers(0, 1000)),
    st.tuples(st.just("end"), st.integers(0, 1000)),
    st.tuples(st.just("tick"), st.sampled_from([0, 0, 1, 2, 5, 40])),  # equal readings too: ties in the window
    st.tuples(st.just("forget"), st.integers(0, 2)),
)


def reads(load: LoadTracker) -> list[Any]:
    """Everything LoadTracker answers, per worker (with types: an int clock's seconds stay ints)."""
    out: list[Any] = []
    for w in WORKERS:
        count, samples = load.ttft_samples(w)
        seconds, fastest = list(load.ttft_seconds(w)), load.ttft_fastest(w)
        out.append((load.in_flight(w), load.prefill_tokens(w), load.prefill_age(w), load.decoding(w),
                    load.active_blocks(w), load.holds(w), count, list(samples), [type(x) for x in samples],
                    seconds, [type(x) for x in seconds], fastest, type(fastest)))
    return out


def fields(ticket: Any) -> tuple[Any, ...]:
    return (ticket.worker_id, ticket.prefill_tokens, list(ticket.hashes), ticket.tail_blocks, ticket.started,
            type(ticket.started), ticket.met, ticket.prefilling, ticket.open)


def run(steps: list[tuple[Any, ...]], clock_type: Callable[[int], Any]) -> None:
    now = [0]
    clock = lambda: clock_type(now[0])  # noqa: E731
    c, py = LoadTracker(clock, native=True), LoadTracker(clock, native=False)
    assert c._cells and not py._cells
    tickets: list[tuple[Any, Any]] = []
    for s in steps:
        if s[0] == "begin":
            _, w, prefill, picks, tail = s
            hashes = [POOL[i] for i in picks]
            tickets.append((c.begin(WORKERS[w], prefill, hashes, tail), py.begin(WORKERS[w], prefill, hashes, tail)))
        elif s[0] in ("first", "end") and tickets:
            pair = tickets[s[1] % len(tickets)]
            for load, ticket in zip((c, py), pair, strict=True):
                (load.prefill_done if s[0] == "first" else load.end)(ticket)
        elif s[0] == "tick":
            now[0] += s[1]
        elif s[0] == "forget":
            c.forget(WORKERS[s[1]])
            py.forget(WORKERS[s[1]])
        assert reads(c) == reads(py)
        for a, b in tickets:
            assert fields(a) == fields(b)


@settings(max_examples=400, deadline=None)
@given(st.lists(step, max_size=120))
def test_c_tickets_read_the_same_as_python_ones(steps: list[tuple[Any, ...]]) -> None:
    run(steps, lambda t: t * 0.001)


@settings(max_examples=100, deadline=None)
@given(st.lists(step, max_size=60))
def test_an_int_clock_keeps_its_ints(steps: list[tuple[Any, ...]]) -> None:
    run(steps, int)


def test_the_window_minimum_through_many_samples() -> None:
    """More samples than the window holds, on one worker: a unique minimum leaves it and is looked for again
    (37 distinct seconds in turn: the window of 32 holds each at most once), then ties of it."""
    steps: list[tuple[Any, ...]] = []
    for k in range(6 * TTFT_SAMPLES):
        ticks = 1 + (k * 13) % 37 if k < 4 * TTFT_SAMPLES else k % 3
        steps += [("begin", 0, 10, [k % 30], 1), ("tick", ticks), ("first", k), ("end", k)]
    run(steps, lambda t: t * 0.001)


def test_c_samples_are_ttft_samples() -> None:
    load = LoadTracker(lambda: 2.5, native=True)
    ticket = load.begin("w", 7, [1, 2], 3)
    load.prefill_done(ticket)
    (sample,) = load.ttft_samples("w")[1]
    assert type(sample) is TtftSample and sample == TtftSample(0.0, 0, 7, 0, 0)
    with pytest.raises(AttributeError):
        sample.seconds = 1.0  # type: ignore[misc]  # still frozen


def test_begin_takes_keywords_and_refuses_what_python_refuses() -> None:
    load = LoadTracker(native=True)
    ticket = load.begin("w", prefill_tokens=5, hashes=[3], tail_blocks=1)
    assert load.active_blocks("w") == 2
    with pytest.raises(TypeError):
        load.begin("w", 5, [3], 1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        load.begin("w", 5, [3])  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        load.begin("w", 5, [3], tail_blocks=1, hashes=[4])  # type: ignore[misc]
    with pytest.raises(TypeError):
        load.end(object())  # type: ignore[arg-type]
    load.end(ticket=ticket)
    assert load.in_flight("w") == 0 and load.active_blocks("w") == 0


def test_an_unheld_hash_on_end_is_a_key_error_after_the_counts_as_python() -> None:
    """A ticket whose worker was forgotten and begun again ends on its own (dropped) cell; the refs stay exact."""
    for native_ in (True, False):
        load = LoadTracker(native=native_)
        old = load.begin("w", 10, [1, 2], 1)
        load.forget("w")
        new = load.begin("w", 10, [2], 1)
        load.end(old)
        assert (load.in_flight("w"), load.active_blocks("w")) == (1, 2)
        load.end(new)
        assert (load.in_flight("w"), load.active_blocks("w")) == (0, 0)
