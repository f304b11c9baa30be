"""A remembered run's drop in C-level passes (``RowRuns._drop``, issue 15's fourteenth round) leaves the rows' state
the per-row loop left: random streams of stores, removals, cleared and removed workers, predictions and queries
(runs captured, extended, patched, replaced by another prompt's with the same first block) on two C indexes, one
dropping runs by the loop, compared after every step: the runs, where each router hash sits, the watched and the
pending hashes, the bytes."""

from __future__ import annotations

import types
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.index import PrefixIndex
from infera.kv.index_rows import RowRuns, Rows
from infera.kv.native import load
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from tests.kv.test_native import BLOCK, HOT, HOT_ROUTER, LONG, hot_op

pytestmark = pytest.mark.skipif(load() is None, reason="the C extension infera.kv._native is not built")


def _loop_drop(self: RowRuns, run: Rows) -> None:
    """The drop before: a step per row."""
    first = run.hashes[0]
    if self.runs.get(first) is run:
        del self.runs[first]
        self._bytes -= len(run.rows)
    at, watched, pending = self._at, self._watched, self._pending
    for local in run.hashes:
        hit = at.get(local)
        if hit is not None and hit[0] is run:
            del at[local]
            watched.discard(local)
            pending.discard(local)


def _rows_state(index: PrefixIndex) -> Any:
    rows = index._rows
    assert rows is not None
    runs = {f: (r.hashes, bytes(r.rows), r.width, r.active, r.result, sorted(r.keys)) for f, r in rows.runs.items()}
    at = {h: (run.hashes[0], row, rows.runs.get(run.hashes[0]) is run) for h, (run, row) in rows._at.items()}
    return runs, at, sorted(rows._watched), sorted(rows._pending), rows._bytes


def _pair() -> tuple[PrefixIndex, PrefixIndex]:
    new, old = PrefixIndex(block_size=BLOCK, native=True), PrefixIndex(block_size=BLOCK, native=True)
    assert old._rows is not None and new._rows is not None
    old._rows._drop = types.MethodType(_loop_drop, old._rows)  # type: ignore[method-assign]
    return new, old


def _engine(k: int, p: int, j: int) -> int:
    return k * 1000 + p * 100 + j


def _stored(k: int, p: int, start: int, n: int) -> BlockStored:
    end = min(LONG, start + n)
    parent = None if start == 0 else _engine(k, p, start - 1)
    return BlockStored([_engine(k, p, j) for j in range(start, end)], parent, HOT[p][start * BLOCK : end * BLOCK],
                       BLOCK)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, LONG), st.integers(0, LONG)), min_size=2, max_size=40),
       st.lists(hot_op, max_size=50), st.sampled_from([1, 3, 8]))
def test_a_drop_leaves_the_state_the_loop_left(holds: list[tuple[int, int]], ops: list[tuple[Any, ...]],
                                               run_min: int) -> None:
    new, old = _pair()
    now = 10.0
    with patch("infera.kv.index.RUN_MIN_BLOCKS", run_min):
        for index in (new, old):
            for k, (d0, d1) in enumerate(holds):
                events: list[Any] = [_stored(k, p, 0, d) for p, d in ((0, d0), (1, d1)) if d]
                index.apply(f"w{k}", EventBatch(1.0, events or [AllBlocksCleared()]))
        for o in [("query", 0, LONG), *ops]:
            got = []
            for index in (new, old):
                if o[0] == "store":
                    index.apply(f"w{o[1]}", EventBatch(1.0, [_stored(*o[1:])]))
                elif o[0] == "remove":
                    index.apply(f"w{o[1]}", EventBatch(1.0, [BlockRemoved([_engine(*o[1:])])]))
                elif o[0] == "remove_worker":
                    index.remove_worker(f"w{o[1]}")
                elif o[0] == "clear":
                    index.apply(f"w{o[1]}", EventBatch(1.0, [AllBlocksCleared()]))
                elif o[0] == "predict":
                    index.predict(f"w{o[1]}", HOT_ROUTER[o[2]][: o[3]], ttl=1.0 if o[4] else 100.0, now=now)
                else:  # a query, confirmed and with predictions (the guessed rows), of the prompt and the other
                    for p in (o[1], 1 - o[1] if o[1] < 2 else 0):
                        got.append(index.overlaps(HOT_ROUTER[p][: o[2]]))
                        got.append(index.overlaps_and_confirmed(HOT_ROUTER[p][: o[2]], now=now))
            if o[0] == "predict":
                now += 0.6
            assert got[: len(got) // 2] == got[len(got) // 2 :], o
            assert _rows_state(new) == _rows_state(old), o


def test_prompts_sharing_a_first_block_replace_each_others_run() -> None:
    """Two prompts with the same first 6 blocks, held by three workers and predicted on a fourth, queried in turn as
    kv-aware asks (with predictions): each query captures its prompt's run and drops the other's, in C passes, the
    dropped run's rows noted as changed (another worker stored them) since its query."""
    new, old = _pair()
    drops = []
    for index in (new, old):
        for k in range(3):
            index.apply(f"w{k}", EventBatch(1.0, [_stored(k, p, 0, LONG) for p in (0, 1)]))
        index.predict("w3", HOT_ROUTER[0], ttl=100.0, now=1.0)
        rows = index._rows
        assert rows is not None
        real = rows._drop
        rows._drop = lambda run, real=real, rows=rows: (drops.append(rows.runs.get(run.hashes[0]) is run),  # type: ignore[method-assign]
                                                        real(run))[1]
    with patch("infera.kv.index.RUN_MIN_BLOCKS", 4):
        for i in range(6):
            for index in (new, old):
                assert index.overlaps_and_confirmed(HOT_ROUTER[i % 2], now=2.0)[1] == LONG
            assert _rows_state(new) == _rows_state(old)
            assert new._rows is not None and new._rows.runs[HOT_ROUTER[0][0]].hashes == HOT_ROUTER[i % 2]
            for index in (new, old):  # another holder of the run's blocks past the shared ones: rows noted, pending
                index.apply(f"w{4 + i}", EventBatch(1.0, [_stored(4 + i, i % 2, 0, LONG)]))
            assert _rows_state(new) == _rows_state(old)
    assert sum(drops) >= 10  # the live runs' drops, both indexes
