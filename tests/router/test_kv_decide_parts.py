"""kv-aware's one call answering the index's ``holding`` and taking ``overlaps_and_confirmed``' one walk itself, from
the index's tables (``PrefixIndex.decide_parts``, csrc/decide17.c, issue 15's fifteenth round): the same decisions as
the one call through those methods and as the candidates' path, over prompts long enough for the index's remembered
runs (two workers holding a 64-block system prompt: the method's other paths, which the one call leaves to it),
predictions that expire between decisions (the prune), workers that leave and evictions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.index import RUN_MIN_BLOCKS
from infera.kv.native import load as load_native
from infera.protocols.kv_events import BlockRemoved, BlockStored, EventBatch
from infera.protocols.worker import Capacity, WorkerRecord
from tests.router.test_kv_decide import Side

pytestmark = pytest.mark.skipif(load_native() is None, reason="the C extension infera.kv._native is not built")

SIZE = 4
SYSTEM = [7000 + t for t in range((RUN_MIN_BLOCKS + 8) * SIZE)]  # a system prompt past a remembered run's least
# four families: two behind the system prompt, one sharing only its first blocks, one of its own; then a turn each
FAMILIES = [SYSTEM + [100 * f + t for t in range(24)] for f in range(2)] + \
    [SYSTEM[:SIZE * 3] + [500 + t for t in range(80)], [900 + t for t in range(90)]]
PROMPTS = [p + [20000 + 50 * k + t for t in range(k % 3 * SIZE + 2)] for k, p in enumerate(FAMILIES * 2)]


def _workers(n: int) -> list[WorkerRecord]:
    return [WorkerRecord(instance_id=f"w{k}", model="m", http_url="http://x", kv_block_size=SIZE,
                         capacity=Capacity(kv_blocks=4096)) for k in range(n)]


def _without_parts(side: Side) -> Side:
    """The one call through the index's ``holding`` and ``overlaps_and_confirmed`` (the cells and tables kept)."""
    tables = side.policy._decide_tables
    side.policy._decide_tables = lambda: (*tables()[:3], None)
    return side


def _store(wid: int, prompt: list[int], start: int, n: int, remove: bool) -> EventBatch:
    end = min(len(prompt) // SIZE, start + n)
    engine = [hash((wid, tuple(prompt[: (j + 1) * SIZE]))) & (2**63 - 1) for j in range(start, end)]
    if remove:
        return EventBatch(1.0, [BlockRemoved(engine)])
    parent = None if start == 0 else hash((wid, tuple(prompt[: start * SIZE]))) & (2**63 - 1)
    return EventBatch(1.0, [BlockStored(engine, parent, prompt[start * SIZE: end * SIZE], SIZE)])


def _play(sides: list[Side], workers: list[WorkerRecord], ops: list[tuple[Any, ...]]) -> None:
    for o in ops:
        if o[0] == "route":
            pool = [w for k, w in enumerate(workers) if o[3] >> k & 1 or k == 0]
            got = [side.pick(PROMPTS[o[1]], o[2], pool) for side in sides]
            assert all(g == got[0] for g in got[1:]), o
            continue
        for side in sides:
            if o[0] == "first" and side.tickets:
                side.base += o[2]
                side.load.prefill_done(side.tickets[o[1] % len(side.tickets)])
            elif o[0] == "end" and side.tickets:
                side.load.end(side.tickets.pop(o[1] % len(side.tickets)))
            elif o[0] in ("store", "evict") and o[1] < len(workers):
                side.index.apply(f"w{o[1]}", _store(o[1], PROMPTS[o[2]], o[3], o[4], o[0] == "evict"))
            elif o[0] == "forget" and o[1] < len(workers):
                side.index.remove_worker(f"w{o[1]}")
            elif o[0] == "tick":
                side.base += o[1]


op = st.one_of(
    st.tuples(st.just("route"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 40), st.integers(0, 15)),
    st.tuples(st.just("route"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 40), st.just(15)),
    st.tuples(st.just("store"), st.integers(0, 3), st.integers(0, len(PROMPTS) - 1), st.sampled_from([0, 0, 40]),
              st.integers(8, 90)),
    st.tuples(st.just("evict"), st.integers(0, 3), st.integers(0, len(PROMPTS) - 1), st.integers(0, 80),
              st.integers(1, 8)),
    st.tuples(st.just("first"), st.integers(0, 30), st.floats(0.001, 0.2)),
    st.tuples(st.just("end"), st.integers(0, 30)),
    st.tuples(st.just("forget"), st.integers(0, 3)),
    st.tuples(st.just("tick"), st.sampled_from([0.05, 0.25, 1.0])),
)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 4), st.integers(0, 2**32), st.lists(op, min_size=10, max_size=80))
def test_the_parts_decide_as_the_methods(n: int, seed: int, ops: list[tuple[Any, ...]]) -> None:
    workers = _workers(n)
    sides = [Side(True, workers, 0.0, seed), _without_parts(Side(True, workers, 0.0, seed)),
             Side(False, workers, 0.0, seed)]
    assert sides[0].policy._decide_tables()[3] is not None and sides[1].policy._decide_tables()[3] is None
    _play(sides, workers, ops)


def test_the_parts_take_both_paths() -> None:
    """Two workers hold the system prompt (its blocks shared: the index remembers a run, and the method answers from
    it), then prompts of their own: the one call walks itself and calls the method only where a run may start, and
    decides as the candidates' path throughout."""
    workers = _workers(3)
    sides = [Side(True, workers, 0.0, 1), Side(False, workers, 0.0, 1)]
    calls = {"holding": 0, "overlaps_and_confirmed": 0}
    index = sides[0].index
    for name in calls:
        method = getattr(index, name)

        def counted(*args: Any, _m: Any = method, _n: str = name) -> Any:
            calls[_n] += 1
            return _m(*args)

        setattr(index, name, counted)
    sides[0].policy._decide_cfg = None  # built again with the counted methods
    ops: list[tuple[Any, ...]] = [("store", 0, 0, 0, 90), ("store", 1, 1, 0, 90)]
    ops += [("route", k % 2, 4, 7) for k in range(6)]  # the system prompt's family: a run (the method)
    ops += [("route", 3 + 4 * (k % 2), 4, 7) for k in range(6)]  # a family of its own: the one walk in C
    ops += [("tick", 1.0), ("route", 2, 4, 7), ("route", 3, 4, 7)]  # the predictions expired: pruned first
    _play(sides, workers, ops)
    assert index._rows is not None and index._rows.runs  # a run was remembered
    assert calls["holding"] == 0  # always in C
    assert 0 < calls["overlaps_and_confirmed"] < 14  # the run's prompts only
