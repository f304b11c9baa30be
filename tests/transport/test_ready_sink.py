"""A decision's catch-up as the one call the feed binds (``PrefixIndex.ready_sink``, csrc/ready_bound.c) against the
index's ``drain_ready`` with the feed's book (``IndexFeed.on_ready``): on random payloads down two streams of indexes
with remembered walks and predictions, each call leaves the same tables, counters, book and remembered walks, answers
the same, reads the book's clock only when a drain applied batches, and calls Python back only for what is left to it
(touched rows; arrivals while a worker is logged blind)."""

from __future__ import annotations

import functools
import logging
import select
import socket
import time
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import wait_until
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import BlockRemoved, EventBatch, encode_batch, seq_to_bytes
from infera.transport.base import StreamState
from tests.kv.test_index_payload import _HASHES, PREFIX, _start, _state, payloads
from tests.transport.test_zmtp import TOPIC, message, native, queued

WORKERS = ("a", "b")


class Side:
    """An index, its two streams (socket pairs in one epoll) and a feed's book of arrivals."""

    def __init__(self, block_size: int | None) -> None:
        self.index: PrefixIndex = _start(block_size)
        self.ends = {wid: socket.socketpair() for wid in WORKERS}
        self.poller = select.epoll()
        self.states: dict[int, StreamState] = {}
        for wid, (ours, _) in self.ends.items():
            ours.setblocking(False)
            self.states[ours.fileno()] = state = StreamState(wid)
            state.busy = False
            self.poller.register(ours.fileno(), select.EPOLLIN)
        self.batches: Counter[str] = Counter({"a": 3})
        self.last: dict[str, float] = {"b": 0.5}
        self.owed = {"a": 0.25, "b": 0.25, "z": 0.25}
        self.blind: set[str] = set()

    def send(self, wid: str, seq: int, payload: bytes) -> None:
        self.ends[wid][1].sendall(message(TOPIC, seq_to_bytes(seq), payload))
        ours = self.ends[wid][0]
        wait_until(lambda: queued(ours) > 0, 5, "the bytes")
        for state in self.states.values():
            state.expected = None

    def close(self) -> None:
        self.poller.close()
        for a, b in self.ends.values():
            a.close()
            b.close()


def _answers(left: list[tuple[StreamState, int, Any]]) -> list[tuple[str, int, str]]:
    return [(state.worker_id, status, type(extra).__name__) for state, status, extra in left]


@native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["a", "a", "b"]), payloads(), st.booleans(),
                          st.lists(st.sampled_from(range(PREFIX)), max_size=3)), min_size=1, max_size=10),
       st.sampled_from([None, 4]))
def test_the_bound_catch_up_leaves_what_drain_ready_with_the_feeds_book_leaves(
        sends: list[tuple[str, bytes, bool, list[int]]], block_size: int | None) -> None:
    logging.disable(logging.CRITICAL)
    ours, ref = Side(block_size), Side(block_size)
    try:
        ticks: list[float] = []
        posted: list[tuple[list[tuple[str, int]], int]] = []

        def clock() -> float:
            ticks.append(9.0 + len(ticks))
            return ticks[-1]

        def arrived(got: list[tuple[str, int]]) -> None:
            posted.append((list(got), len(ours.blind)))

        sink = ours.index.ready_sink((ours.batches, ours.last, ours.owed), clock, ours.blind, arrived)
        assert isinstance(sink, functools.partial)
        for seq, (wid, payload, blind, guesses) in enumerate(sends):
            for side in (ours, ref):  # a prediction of some prefix blocks, so a store drops it
                routed = [h for i, h in enumerate(side.index._holders.keys()) if i in guesses]
                side.index.predict(wid, routed, ttl=10.0, now=0.0)
                side.blind.clear()
                if blind:
                    side.blind.add(wid)
                side.send(wid, seq, payload)
            ticks.clear()
            posted.clear()
            others, left = sink(ours.poller.fileno(), ours.states)
            r_others, r_left, r_arrived = ref.index.drain_ready(
                ref.poller.fileno(), ref.states, book=(ref.batches, ref.last, ref.owed, 9.0))
            assert (others, _answers(left)) == (r_others, _answers(r_left)) == ([], _answers(r_left))
            assert ticks == ([9.0] if r_arrived else [])  # the clock read once, at the first drain that applied
            assert posted == ([(r_arrived, 1)] if blind and r_arrived else [])
            for side in (ours, ref):  # the wall clock's times (now=None) cannot be compared
                for worker in side.index._workers.values():
                    worker.last_applied_at = 0.0
            assert _state(ours.index) == _state(ref.index), payload
            assert (ours.batches, ours.last, ours.owed) == (ref.batches, ref.last, ref.owed)
        walk = list(ref.index._holders.keys())[:PREFIX]
        assert ours.index.overlaps(walk) == ref.index.overlaps(walk)  # remembered walks, settled from touched rows
    finally:
        logging.disable(logging.NOTSET)
        ours.close()
        ref.close()


@native
def test_the_bound_catch_up_calls_python_for_touched_rows_only_when_there_are_some() -> None:
    """A removal that changes a remembered walk's mask reaches the index's ``_touch`` through the one callback,
    after the clock was read for the book; a catch-up with nothing ready reads no clock and calls nothing back."""
    side = Side(4)
    try:
        calls: list[Any] = []
        side.index._touch = lambda touched: calls.append(list(touched))  # type: ignore[method-assign]

        def clock() -> float:
            calls.append("clock")
            return 1.0

        sink = side.index.ready_sink((side.batches, side.last, side.owed), clock, side.blind, calls.append)
        assert sink is not None
        assert sink(side.poller.fileno(), side.states) == ([], []) and calls == []
        walk = list(side.index._holders.keys())[:PREFIX]
        side.index.overlaps(walk)  # remembered: the walk's masks are watched now
        assert walk[0] in side.index._watched
        side.send("b", 0, encode_batch(EventBatch(0.0, [BlockRemoved([_HASHES["b"][0]])])))
        assert sink(side.poller.fileno(), side.states) == ([], [])
        assert calls == ["clock", [walk[0]]] and side.batches["b"] == 1 and side.last["b"] == 1.0
    finally:
        side.close()


class _Without:
    """The C module less ``ready_sink`` (an extension built before it)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "ready_sink":
            raise AttributeError(name)
        return getattr(self._inner, name)


class _Bound:
    """An event source that keeps the ready sink a feed binds."""

    ready: Any = None

    def bind(self, *sinks: Any) -> None:
        self.ready = sinks[5] if len(sinks) > 5 else None

    def watch(self, worker: Any) -> None:
        pass


def test_the_feed_binds_the_c_catch_up_where_it_is_built_and_on_ready_or_nothing_elsewhere() -> None:
    from infera.kv.feed import IndexFeed
    from tests.fakes import FakeFleet

    source = _Bound()
    IndexFeed(FakeFleet(), source, PrefixIndex())  # type: ignore[arg-type]
    if PrefixIndex().takes_streams:
        assert isinstance(source.ready, functools.partial)
    older = PrefixIndex()
    if older.native is not None:
        older._native = _Without(older.native)
        feed = IndexFeed(FakeFleet(), source, older)  # type: ignore[arg-type]
        assert older.ready_sink(({}, {}, {}), time.monotonic, set(), print) is None
        assert source.ready == (feed.on_ready if older.takes_ready else None)
    IndexFeed(FakeFleet(), source, PrefixIndex(native=False))  # type: ignore[arg-type]
    assert source.ready is None  # the pure-Python path: each link's reader
