"""KV-aware scoring: prefill work left after the cache credit, plus decode load.

cost(w) = kv_overlap_weight * prefill_blocks(w) + decode_blocks(w), in KV blocks, where
prefill_blocks = the prompt's blocks not cached on w + prompt tokens already queued for
prefill on w (in blocks), and decode_blocks = distinct blocks w's active requests hold.
The load term is what stops a hot prefix from piling every request onto one worker.
A cached block counts fully on the device; held only in a lower tier (host memory after an
offload or a kvd prewarm) it counts :data:`TIER_CREDIT` of a block, since it must be copied
back first (NVIDIA Dynamo weighs host-memory blocks 0.75).
For a worker whose KV events are missing or stale, the cache is predicted from the
router's own recent decisions instead of read from events.
"""

from __future__ import annotations

from collections.abc import Sequence

from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores, cached_credit


class KvAwarePolicy:
    needs_tokens = True

    def __init__(self, deps: PolicyDeps) -> None:
        self._index = deps.index
        self._weight = deps.kv_overlap_weight
        self._blind = deps.blind

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        overlaps: list[int] = []
        by_size: dict[int, dict[str, int]] = {}
        blind = {c.worker.instance_id for c in candidates if self._blind(c.worker.instance_id)}
        for cand in candidates:
            size = cand.worker.kv_block_size
            found = by_size.get(size)
            if found is None:
                found = self._index.overlaps(ctx.hashes(size), use_predicted=blind or False)
                by_size[size] = found
            overlaps.append(found.get(cand.worker.instance_id, 0))
        costs: list[float] = []
        for cand, overlap in zip(candidates, overlaps, strict=True):
            size = cand.worker.kv_block_size
            prompt_blocks = -(-ctx.prompt_tokens // size)
            credit = cached_credit(self._index, cand.worker.instance_id, ctx.hashes(size), overlap)
            prefill = (prompt_blocks - credit) + cand.prefill_tokens / size
            costs.append(self._weight * prefill + cand.active_blocks)
        best_overlap = max(overlaps, default=0)
        if best_overlap == 0:
            reason = "no-hit"
        else:
            cheapest = min(range(len(costs)), key=costs.__getitem__)
            reason = "cache-hit" if overlaps[cheapest] == best_overlap else "load"
        return Scores(costs=costs, reason=reason, overlap_blocks=overlaps)
