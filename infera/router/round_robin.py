"""Round-robin: a stateless even spread (one counter, no view of the caches)."""

from __future__ import annotations

from collections.abc import Sequence

from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores


class RoundRobinPolicy:
    needs_tokens = False

    def __init__(self, deps: PolicyDeps) -> None:
        self._next = 0

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        n = len(candidates)
        start = self._next % n
        self._next += 1
        # Candidates arrive sorted by instance id; the one at ``start`` costs least.
        return Scores(costs=[float((i - start) % n) for i in range(n)], reason="rotation")
