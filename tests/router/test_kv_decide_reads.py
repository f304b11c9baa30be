"""kv-aware's one call reading the load tracker's cells and the index's worker tables in C, and refreshing a worker's
kept speed-scale sums there (issue 15's fourteenth round): the same decisions as the candidates' path when the
workers' TTFT samples make their speed scales differ (a slow worker, windows that wrap, ints in the window), and as
its own path through the tracker's and index's methods (the cells and tables not handed to C)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.native import load as load_native
from infera.protocols.worker import Capacity, WorkerRecord
from tests.router.test_kv_decide import PROMPTS, Side

pytestmark = pytest.mark.skipif(load_native() is None, reason="the C extension infera.kv._native is not built")


def _workers(n: int, capacities: list[int]) -> list[WorkerRecord]:
    return [WorkerRecord(instance_id=f"w{k}", model="m", http_url="http://x", kv_block_size=4,
                         capacity=Capacity(kv_blocks=capacities[k])) for k in range(n)]


def _methods_only(side: Side) -> Side:
    """The one call without the cells and tables: the tracker's and the index's methods, and ``_refresh``."""
    side.policy._decide_tables = lambda: (None, None, None, None)
    return side


def _play(sides: list[Side], workers: list[WorkerRecord], ops: list[tuple[Any, ...]]) -> int:
    scaled = 0
    for o in ops:
        if o[0] == "route":
            pool = [workers[o[3] % len(workers)]] if o[4] else workers
            got = [side.pick(PROMPTS[o[1]], o[2], pool) for side in sides]
            assert all(g == got[0] for g in got[1:]), o
            kept = [{w: (x.observed, x.modelled, x.floor, x.n, x.count, x.capacity, list(x.parts))
                     for w, x in side.policy._scales.items()} for side in sides]
            assert all(k == kept[0] for k in kept[1:]), o
            scaled += any(x.n >= 8 for x in sides[0].policy._scales.values())
            continue
        for side in sides:
            if o[0] == "first" and side.tickets:
                ticket = side.tickets[o[1] % len(side.tickets)]
                side.base += o[2] * (5 if ticket.worker_id == "w0" else 1)  # w0 is slow
                side.load.prefill_done(ticket)
            elif o[0] == "end" and side.tickets:
                side.load.end(side.tickets.pop(o[1] % len(side.tickets)))
    return scaled


op = st.one_of(
    st.tuples(st.just("route"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 40), st.integers(0, 5),
              st.booleans()),
    st.tuples(st.just("first"), st.integers(0, 30), st.floats(0.001, 0.3)),
    st.tuples(st.just("first"), st.integers(0, 30), st.floats(0.001, 0.3)),
    st.tuples(st.just("end"), st.integers(0, 30)),
)


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 5), st.lists(st.sampled_from([0, 48, 4096]), min_size=5, max_size=5), st.integers(0, 2**32),
       st.lists(op, min_size=40, max_size=160))
def test_the_cells_and_the_refresh_decide_as_the_methods(n: int, capacities: list[int], seed: int,
                                                         ops: list[tuple[Any, ...]]) -> None:
    workers = _workers(n, capacities)
    sides = [Side(True, workers, 0.0, seed), Side(False, workers, 0.0, seed),
             _methods_only(Side(True, workers, 0.0, seed))]
    assert sides[0].policy._decide_tables()[0] is not None
    _play(sides, workers, ops)


def test_a_slow_worker_is_scaled_alike() -> None:
    """Every worker past MIN_SAMPLES and its window wrapped (TTFT_SAMPLES), w0 five times slower: the speed scales
    differ, and the one call's costs are the candidates' to the bit at every decision."""
    workers = _workers(3, [48, 48, 4096])
    sides = [Side(True, workers, 0.0, 3), Side(False, workers, 0.0, 3)]
    ops: list[tuple[Any, ...]] = []
    for i in range(150):
        ops += [("route", i % len(PROMPTS), 1 + i % 7, i % 3, True), ("first", -1, 0.01 + (i % 5) * 0.003),
                ("end", -1), ("route", (i * 7) % len(PROMPTS), 3, 0, False), ("first", -1, 0.01), ("end", -1)]
    scaled = _play(sides, workers, ops)
    assert scaled > 100
    scales = sides[0].policy._scales_of([sides[0].policy._scales[w.instance_id] for w in workers])
    assert scales[0] > 1.0  # the slow worker counts slower: the refresh's sums reached the cost


class IntSide(Side):
    """A clock of ints: the TTFT window's seconds are ints."""

    def clock(self) -> float:
        self.reads += 1
        return int(self.base * 100) + self.reads


def test_an_int_window_takes_the_sum_fallback() -> None:
    """An int clock makes the window's seconds ints: kv_refresh leaves the two sums to ``_sum_window`` (sum()), as
    the Python path does."""
    workers = _workers(2, [48, 48])
    sides = [IntSide(True, workers, 0.0, 5), IntSide(False, workers, 0.0, 5)]
    ops: list[tuple[Any, ...]] = []
    for i in range(60):
        ops += [("route", i % len(PROMPTS), 2, i % 2, True), ("first", -1, 0.01 * (1 + i % 4)), ("end", -1)]
    _play(sides, workers, ops)
    sums = sides[0].policy._scales["w0"]
    assert sums.n > 8 and type(sides[0].load.ttft_seconds("w0")[0]) is int
