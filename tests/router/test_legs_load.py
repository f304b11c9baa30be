"""A placement's load through Legs (hold, first byte, move to a fallback, failure, release) on the load tracker's C
path against its Python lines: the numbers every policy reads, and the predictions, the same after every step. The C
path twice: with the hold as one C call (``_native.legs_hold``, csrc/hold18.c) and with Legs' own hold lines calling
the C tracker and index."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.feed import IndexFeed
from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.router.base import RoutingContext
from infera.router.candidates import Candidates
from infera.router.legs import Legs
from infera.router.pick import RouterStats
from infera.router.placement import Placement
from tests.fakes import FakeFleet, FakeTransport, worker

native = pytest.importorskip("infera.kv._native")

BS = 4
MIXED = [worker(f"m{k}", kv_block_size=BS, events=k != 1) for k in range(3)]
PREFILL = [worker(f"p{k}", role="prefill", kv_block_size=BS, events=True) for k in range(2)]
DECODE = [worker(f"d{k}", role="decode", kv_block_size=BS) for k in range(2)]
ALL = MIXED + PREFILL + DECODE
PROMPTS = [[7] * 8 + [k] * 5 for k in range(4)] + [[1, 2, 3]]  # a shared prefix, and one without a full block


class Side:
    def __init__(self, native_: bool, one_call: bool = True) -> None:
        self.now = 100.0
        fleet = FakeFleet(*ALL)
        self.load = LoadTracker(clock=lambda: self.now, native=native_)
        self.index = PrefixIndex(native=native_)
        self.feed = IndexFeed(fleet, None, self.index, clock=lambda: self.now)
        self.candidates = Candidates(fleet, clock=lambda: self.now)
        self.stats = RouterStats()
        self.legs = Legs(FakeTransport(), self.load, self.feed, self.candidates, self.stats, clock=lambda: self.now)
        if not one_call:
            self.legs.hold = self.legs._hold
        self.placements: list[Placement] = []

    def reads(self) -> list[Any]:
        out: list[Any] = [self.stats.overlap_hits, self.stats.overlap_sum, self.stats.overlap_count,
                          self.candidates.cooling_down(), sorted(self.index._predicted.items()),
                          sorted(self.index._expiry_heap)]
        for w in ALL:
            wid = w.instance_id
            count, samples = self.load.ttft_samples(wid)
            out.append((self.load.in_flight(wid), self.load.prefill_tokens(wid), self.load.prefill_age(wid),
                        self.load.decoding(wid), self.load.active_blocks(wid), count, list(samples),
                        list(self.load.ttft_seconds(wid)), self.load.ttft_fastest(wid), self.feed.holds(wid)))
        return out


op = st.one_of(
    st.tuples(st.just("mixed"), st.integers(0, 2), st.integers(0, 4), st.integers(0, 3), st.integers(1, 9)),
    st.tuples(st.just("pd"), st.integers(0, 1), st.integers(0, 1), st.integers(0, 4), st.integers(0, 3)),
    st.tuples(st.sampled_from(["answered", "release", "release-role", "failed", "busy", "moved"]),
              st.integers(0, 50), st.integers(0, 2)),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.25, 3.0, 200.0])),  # past the prediction TTL too
)


def step(side: Side, o: tuple[Any, ...]) -> None:
    if o[0] == "tick":
        side.now += o[1]
        return
    if o[0] in ("mixed", "pd"):
        prompt = PROMPTS[o[2] if o[0] == "mixed" else o[3]]
        ctx = RoutingContext(model="m", token_ids=list(prompt), prompt_tokens=len(prompt), max_tokens=4)
        if o[0] == "mixed":
            workers = {"mixed": MIXED[o[1]]}
            overlap, fallbacks = o[3], [w for w in MIXED if w is not MIXED[o[1]]]
        else:
            workers = {"prefill": PREFILL[o[1]], "decode": DECODE[o[2]]}
            overlap, fallbacks = o[4], [w for w in DECODE if w is not DECODE[o[2]]]
        overlap = min(overlap, len(ctx.hashes(BS)))
        side.placements.append(side.legs.place(o[0], workers, None, ctx, overlap, frozenset(), 1, fallbacks))
        return
    if not side.placements:
        return
    placement = side.placements[o[1] % len(side.placements)]
    if o[0] == "answered":
        placement.answered()
    elif o[0] == "release":
        placement.release()
    elif o[0] == "release-role":
        placement.release(sorted(placement.tickets)[o[2] % len(placement.tickets)])
    elif o[0] in ("failed", "busy"):
        placement.failed(placement.worker.instance_id, retryable=o[0] == "busy")
    else:
        placement.moved_to(placement.fallbacks[o[2] % len(placement.fallbacks)])


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=80))
def test_legs_hold_the_same_load_on_either_path(ops: list[tuple[Any, ...]]) -> None:
    c, lines, py = Side(True), Side(True, one_call=False), Side(False)
    assert c.load._cells and not py.load._cells
    assert isinstance(c.legs.hold, functools.partial) and not isinstance(lines.legs.hold, functools.partial)
    for o in ops:
        step(c, o)
        step(lines, o)
        step(py, o)
        assert c.reads() == lines.reads() == py.reads()
        # the predictions' expiry heap to the entry (expiry, sequence, worker, fresh hashes) and in its order
        assert c.index._expiry_heap == lines.index._expiry_heap
    for side in (c, lines, py):  # every path releases everything: no in-flight count leaks
        for placement in side.placements:
            placement.release()
        assert all(side.load.in_flight(w.instance_id) == 0 and side.load.active_blocks(w.instance_id) == 0
                   and side.load.prefill_tokens(w.instance_id) == 0 for w in ALL)


def test_stats_of_another_class_keep_their_own_observe_overlap() -> None:
    """The C hold counts the overlap into RouterStats' own fields (its ``observe_parts``); stats of a subclass answer
    None there, so the hold is Legs' lines and their ``observe_overlap`` is the one called."""
    seen: list[float] = []

    class Recorded(RouterStats):
        def observe_overlap(self, fraction: float) -> None:
            seen.append(fraction)
            super().observe_overlap(fraction)

    plain, recorded = RouterStats(), Recorded()
    assert plain.observe_parts() is not None and recorded.observe_parts() is None
    side = Side(True)
    assert isinstance(side.legs.hold, functools.partial)
    legs = Legs(FakeTransport(), side.load, side.feed, side.candidates, recorded, clock=lambda: side.now)
    assert not isinstance(legs.hold, functools.partial)
    prompt = PROMPTS[0]
    ctx = RoutingContext(model="m", token_ids=list(prompt), prompt_tokens=len(prompt), max_tokens=4)
    legs.place("mixed", {"mixed": MIXED[0]}, None, ctx, 2, frozenset(), 1).release()
    assert seen == [2 / len(ctx.hashes(BS))] and recorded.overlap_count == 1
