"""Pick: the policy's costs, temperature, a fair tie-break, and the decision statistics.

The policy only scores (:mod:`infera.router.base`). With ``temperature`` > 0 the pick is a
softmax draw over ``-(cost - min) / temperature``; otherwise the cheapest wins and ties go
to the least busy worker, then the emptiest cache (distinct prefixes spread instead of
piling up), then chance. :meth:`Picker.preview` answers "whom would you pick now" without
recording anything (prewarm, the endpoint picker's dry runs): no statistics, no chance (the
lowest id wins the last tie), and a policy that does not read the cache is not consulted
(it may be stateful, like a rotation).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence

from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.protocols.worker import WorkerRecord
from infera.router.base import Candidate, Policy, RoutingContext

OVERLAP_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


@dataclasses.dataclass
class RouterStats:
    """Counters since start; read by the metrics endpoint through the router's read API."""

    decisions: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)  # (policy, reason)
    retries: int = 0
    # per OVERLAP_BUCKETS bound, the fractions whose first bound at or above them it is (one count each, found by
    # bisection); ``overlap_buckets`` accumulates them on read, when the metrics endpoint asks
    overlap_hits: list[int] = dataclasses.field(default_factory=lambda: [0] * len(OVERLAP_BUCKETS))
    overlap_sum: float = 0.0
    overlap_count: int = 0

    def observe_overlap(self, fraction: float) -> None:
        i = bisect.bisect_left(OVERLAP_BUCKETS, fraction)
        if i < len(OVERLAP_BUCKETS):
            self.overlap_hits[i] += 1
        self.overlap_sum += fraction
        self.overlap_count += 1

    def observe_parts(self) -> tuple[RouterStats, tuple[float, ...]] | None:
        """What ``_native.legs_hold`` reads to run :meth:`observe_overlap` in C (csrc/hold18.c: the hits, sum and count
        attributes, the bounds): this object and :data:`OVERLAP_BUCKETS`; None for a subclass, whose
        ``observe_overlap`` may be another (the hold then calls the method)."""
        return (self, OVERLAP_BUCKETS) if type(self) is RouterStats else None

    @property
    def overlap_buckets(self) -> list[int]:
        """Cumulative counts per :data:`OVERLAP_BUCKETS` bound (observations ``<=`` it)."""
        return list(itertools.accumulate(self.overlap_hits))


@dataclasses.dataclass(slots=True)  # not frozen: a frozen init sets each field through object.__setattr__
class Choice:
    worker: WorkerRecord
    reason: str
    overlap: int  # prompt blocks the policy believes the worker holds (0 for cache-blind policies)
    cost: float = 0.0  # the policy's cost of the chosen worker (any scale; lower is better)
    candidates: int = 1  # workers the policy scored


class Picker:
    def __init__(self, index: PrefixIndex, load: LoadTracker, stats: RouterStats, temperature: float = 0.0,
                 rng: random.Random | None = None) -> None:
        self._index = index
        self._load = load
        self._stats = stats
        self._temperature = temperature
        self._rng = rng or random.Random()

    def _candidates(self, workers: Sequence[WorkerRecord]) -> list[Candidate]:
        load = self._load
        return [Candidate(w, load.in_flight(w.instance_id), load.prefill_tokens(w.instance_id),
                          load.active_blocks(w.instance_id)) for w in workers]

    def pick(self, ctx: RoutingContext, workers: Sequence[WorkerRecord], policy: Policy, name: str) -> Choice:
        """The worker to send to; counts the decision under ``(name, reason)``."""
        # a policy that scores the worker records itself, reading the same load tracker (kv-aware: one C call, issue
        # 15's twelfth round), builds no candidates; None: it does not apply, score the candidates
        fast = getattr(policy, "score_workers", None)
        scores = fast(ctx, workers, self._load) if fast is not None else None
        cands: list[Candidate] | None = None
        if scores is None:
            cands = self._candidates(workers)
            scores = policy.score(ctx, cands)
        costs = scores.costs
        if len(costs) == 1:
            i = 0  # one candidate: no temperature, no tie to break
        elif self._temperature > 0:
            low = min(costs)
            weights = [math.exp(-(c - low) / self._temperature) for c in costs]
            i = self._rng.choices(range(len(costs)), weights=weights)[0]
        else:
            low = min(costs)
            # no tie when the second lowest is more than the tolerance above the lowest (c - low grows with c): the
            # lowest's index, without a Python step per cost
            if sorted(costs)[1] - low > 1e-9:
                i = costs.index(low)
            else:
                best = []
                for j, c in enumerate(costs):  # a loop, not a comprehension: no frame of its own per decision
                    if c - low <= 1e-9:
                        best.append(j)
                if len(best) > 1:  # the candidates' in-flight counts: read now if no candidates were built (the same)
                    best = self._least_busy(cands if cands is not None else self._candidates(workers), best)
                i = best[0] if len(best) == 1 else self._rng.choice(best)
        self._stats.decisions[(name, scores.reason)] += 1
        overlap = scores.overlap_blocks[i] if scores.overlap_blocks else 0
        return Choice(workers[i], scores.reason, overlap, costs[i], len(costs))

    def preview(self, ctx: RoutingContext, workers: Sequence[WorkerRecord], policy: Policy) -> WorkerRecord:
        """The worker :meth:`pick` would choose now, recording nothing (``workers`` sorted by id)."""
        cands = self._candidates(workers)
        costs = policy.score(ctx, cands).costs if policy.needs_tokens else [0.0] * len(cands)
        low = min(costs)
        return workers[self._least_busy(cands, [j for j, c in enumerate(costs) if c - low <= 1e-9])[0]]

    def _least_busy(self, cands: list[Candidate], best: list[int]) -> list[int]:
        if len(best) <= 1:
            return best

        def key(j: int) -> tuple[int, int]:
            return cands[j].in_flight, self._index.block_count(cands[j].worker.instance_id)

        least = min(key(j) for j in best)
        return [j for j in best if key(j) == least]

    def others(self, chosen: WorkerRecord, pool: Sequence[WorkerRecord], n: int) -> list[WorkerRecord]:
        """Up to ``n`` fallbacks for ``chosen`` from its pool: the least loaded first."""
        if n <= 0:
            return []
        rest = [w for w in pool if w.instance_id != chosen.instance_id]
        rest.sort(key=lambda w: (self._load.in_flight(w.instance_id), w.instance_id))
        return rest[:n]

    def count_direct(self) -> None:
        """A decision made by direct-mode headers, not by a policy."""
        self._stats.decisions[("direct", "header")] += 1
