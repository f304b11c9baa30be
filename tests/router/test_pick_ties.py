"""Picker.pick's choice among the costs (temperature 0): the lowest, ties within 1e-9 broken by the least busy worker,
then the emptiest cache, then chance. Its no-tie shortcut (the second lowest more than the tolerance above the lowest)
against the loop over every cost it skips: the same worker and the same draws of the rng, on costs near the
tolerance, repeated, signed zeros and large."""

from __future__ import annotations

import random
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.protocols.worker import WorkerRecord
from infera.router.base import Candidate, RoutingContext, Scores
from infera.router.pick import Picker, RouterStats
from tests.fakes import worker

WORKERS = [worker(f"w{k}") for k in range(6)]


class Fixed:
    """A policy answering the costs it is given."""

    needs_tokens = False

    def __init__(self, costs: list[float]) -> None:
        self.costs = costs

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        return Scores(list(self.costs), "fixed")


def loop_choice(picker: Picker, costs: list[float], workers: list[WorkerRecord], rng: random.Random) -> WorkerRecord:
    """The lines before the shortcut: every cost within the tolerance of the lowest, then the tie-break."""
    low = min(costs)
    best = [j for j, c in enumerate(costs) if c - low <= 1e-9]
    if len(best) > 1:
        best = picker._least_busy(picker._candidates(workers), best)
    return workers[best[0] if len(best) == 1 else rng.choice(best)]


base = st.sampled_from([0.0, -0.0, 1.0, 3.5, 1e6, 123456.789])
nudge = st.sampled_from([0.0, 0.0, 5e-10, 1e-9, 1.0000001e-9, 2e-9, 1e-6, 1.0, -5e-10])
costs_st = st.lists(st.tuples(base, nudge), min_size=2, max_size=6).map(lambda xs: [a + b for a, b in xs])


@settings(max_examples=500, deadline=None)
@given(costs_st, st.lists(st.integers(0, 2), min_size=6, max_size=6), st.integers(0, 2**32))
def test_the_no_tie_shortcut_picks_as_the_loop(costs: list[float], busy: list[int], seed: int) -> None:
    load = LoadTracker(clock=lambda: 0.0)
    workers = WORKERS[:len(costs)]
    for w, n in zip(workers, busy, strict=False):
        for _ in range(n):
            load.begin(w.instance_id, 0, [], 1)
    picker = Picker(PrefixIndex(), load, RouterStats(), rng=random.Random(seed))
    reference = random.Random(seed)
    ctx = RoutingContext(model="m", token_ids=None, prompt_tokens=1, max_tokens=1)
    for _ in range(3):
        chosen = picker.pick(ctx, workers, Fixed(costs), "fixed").worker
        assert chosen is loop_choice(picker, costs, workers, reference)
        assert picker._rng.getstate() == reference.getstate()
