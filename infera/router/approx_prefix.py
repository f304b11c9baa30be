"""Approximate prefix routing from the router's own history, for engines that publish no KV events.

It behaves like sglang-router's ``cache_aware`` policy (sgl-router src/policies/cache_aware.rs):
a prefix tree per worker of what the router sent there, updated at routing time, never from
the engine. For each request:

1. if the fleet is imbalanced -- (max - min) in-flight requests > ``BALANCE_ABS_THRESHOLD`` and
   max > min * ``BALANCE_REL_THRESHOLD`` -- take the least loaded worker (first of equals);
2. otherwise take the worker whose tree matches the longest prefix of the prompt, if that
   match covers more than ``CACHE_THRESHOLD`` of the prompt; else the worker with the smallest
   tree (first of equals);
3. either way, insert the prompt into the chosen worker's tree.

Defaults are sglang-router's current ones (cache_threshold 0.3, balance_abs_threshold 64,
balance_rel_threshold 1.5, max_tree_size 2**26). Differences, said plainly: the tree is
over token ids at :data:`GRANULE`-token resolution (chained hashes of 16-token pieces, so a
match is a whole number of pieces) instead of characters; a tree over its size limit evicts its
least recently routed pieces at insert time instead of in a 120 s background sweep. The
policy inserts into the worker it scores cheapest and makes that choice strict (no ties
left for the router to break), so it assumes temperature 0.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
MAX_TREE_TOKENS = 1 << 26
GRANULE = 16  # tokens per tree piece


class PrefixTrees:
    """Per worker, the prefix pieces routed to it, most recently routed last (LRU order)."""

    def __init__(self, max_tokens: int = MAX_TREE_TOKENS) -> None:
        self.max_pieces = max(1, max_tokens // GRANULE)
        self._trees: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[str]] = {}

    def size(self, worker_id: str) -> int:
        """Tokens in the worker's tree."""
        tree = self._trees.get(worker_id)
        return len(tree) * GRANULE if tree else 0

    def matches(self, pieces: Sequence[int]) -> dict[str, int]:
        """Per worker holding the first piece, how many leading pieces its tree holds."""
        if not pieces:
            return {}
        first = self._holders.get(pieces[0])
        if not first:
            return {}
        active = set(first)
        out: dict[str, int] = {}
        for i, piece in enumerate(pieces[1:], start=1):
            held = self._holders.get(piece)
            gone = active - held if held else set(active)
            for w in gone:
                out[w] = i
            active -= gone
            if not active:
                return out
        for w in active:
            out[w] = len(pieces)
        return out

    def insert(self, worker_id: str, pieces: Sequence[int]) -> None:
        tree = self._trees.get(worker_id)
        if tree is None:
            tree = self._trees[worker_id] = OrderedDict()
        holders = self._holders
        for piece in pieces:
            if piece in tree:
                tree.move_to_end(piece)
            else:
                tree[piece] = None
                holders.setdefault(piece, set()).add(worker_id)
        while len(tree) > self.max_pieces:
            old, _ = tree.popitem(last=False)
            held = holders[old]
            held.discard(worker_id)
            if not held:
                del holders[old]


class ApproxPrefixPolicy:
    needs_tokens = True

    def __init__(self, deps: PolicyDeps, max_tree_tokens: int = MAX_TREE_TOKENS) -> None:
        self.trees = PrefixTrees(max_tree_tokens)

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        pieces = ctx.hashes(GRANULE)
        found = self.trees.matches(pieces)
        matched = [found.get(c.worker.instance_id, 0) for c in candidates]
        loads = [c.in_flight for c in candidates]
        high, low = max(loads), min(loads)
        if high - low > BALANCE_ABS_THRESHOLD and high > low * BALANCE_REL_THRESHOLD:
            chosen, reason = loads.index(low), "imbalanced"
        else:
            best = max(matched)
            if ctx.prompt_tokens and best * GRANULE / ctx.prompt_tokens > CACHE_THRESHOLD:
                chosen, reason = matched.index(best), "cache-hit"
            else:
                sizes = [self.trees.size(c.worker.instance_id) for c in candidates]
                chosen, reason = sizes.index(min(sizes)), "smallest-tree"
        self.trees.insert(candidates[chosen].worker.instance_id, pieces)
        return Scores(costs=[0.0 if i == chosen else 1.0 for i in range(len(candidates))], reason=reason,
                      overlap_blocks=[m * GRANULE // c.worker.kv_block_size for m, c in zip(matched, candidates,
                                                                                             strict=True)])
