"""Round-robin: a stateless even spread (one counter, no view of the caches, no read of the loads)."""

from __future__ import annotations

from collections.abc import Sequence

from infera.kv.load import LoadTracker
from infera.protocols.worker import WorkerRecord
from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores

CACHED_UP_TO = 64  # fleets up to this size get their n cost lists made once (n² floats), not per request


class RoundRobinPolicy:
    needs_tokens = False

    def __init__(self, deps: PolicyDeps) -> None:
        self._next = 0
        self._rotations: list[list[float]] = []  # for a pool of len(self._rotations): the costs per start

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        return self._rotate(len(candidates))

    def score_workers(self, ctx: RoutingContext, workers: Sequence[WorkerRecord], load: LoadTracker) -> Scores:
        """:meth:`score` from the worker records alone: a rotation reads no load, and its costs are distinct (no tie
        for the picker to break by load), so the picker need not build a :class:`Candidate` per worker (three load
        reads each) for it."""
        return self._rotate(len(workers))

    def _rotate(self, n: int) -> Scores:
        start = self._next % n
        self._next += 1
        # Candidates arrive sorted by instance id; the one at ``start`` costs least. The lists are shared
        # between requests: nothing changes a Scores' costs.
        if n <= CACHED_UP_TO:
            if len(self._rotations) != n:
                self._rotations = [_rotation(n, s) for s in range(n)]
            return Scores(costs=self._rotations[start], reason="rotation")
        return Scores(costs=_rotation(n, start), reason="rotation")


def _rotation(n: int, start: int) -> list[float]:
    return [float((i - start) % n) for i in range(n)]
