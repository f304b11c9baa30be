"""Predictions.prune's loop over an expired add in C (``_native.predict_expire``, csrc/hold18.c) against its Python
lines: predictions added, extended and expired in any order over a few workers, the masks and every worker's
expiries the same after each prune."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.index_tables import Predictions, WorkerTable

native = pytest.importorskip("infera.kv._native")

op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.lists(st.integers(0, 12), max_size=20), st.integers(1, 6)),
    st.tuples(st.just("prune"), st.integers(0, 8)),
)


def side(c: bool) -> tuple[Predictions, dict[str, WorkerTable]]:
    predictions = Predictions(native)
    if not c:
        predictions._expire = None  # the Python lines, over the same U64Maps
    workers = {}
    for k in range(3):
        workers[f"w{k}"] = WorkerTable(k, 1 << k, predicted=native.U64Map(True))
    return predictions, workers


def state(predictions: Predictions, workers: dict[str, WorkerTable]) -> list[Any]:
    return [sorted(predictions.masks.items()), predictions.heap,
            [sorted(w.predicted.items()) for w in workers.values()]]


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_expire_as_the_lines(ops: list[tuple[Any, ...]]) -> None:
    c, py = side(True), side(False)
    assert c[0]._expire is not None
    for o in ops:
        for predictions, workers in (c, py):
            if o[0] == "add":
                wid = f"w{o[1]}"
                predictions.add(wid, workers[wid], [h * 7919 for h in o[2]], float(o[3]))
            else:
                predictions.prune(float(o[1]), workers)
        assert state(*c) == state(*py)
    for predictions, workers in (c, py):  # everything expires: nothing left behind
        predictions.prune(100.0, workers)
        assert not predictions.masks and not any(len(w.predicted) for w in workers.values())
