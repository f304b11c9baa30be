"""``kv-aware`` (the default): the predicted-TTFT cost, evictions priced by how recently the evicted blocks were used
(issue 14, seventh round; the cost pricing every evicted block alike, the default before, is ``kv-aware-flat``).

``kv-aware-flat`` charges a request for the cached blocks of other prefixes it makes a full worker evict, as
:data:`~infera.router.kv_ttft.EVICTION_WEIGHT` of recomputing them, whatever those blocks are. Once every
worker's cache is full (the Mooncake trace over 64 workers) that term is the same on every worker, so a new
conversation lands wherever the other terms say, and the fleet's memory is not used as one LRU would use it: one
worker evicts a conversation that returns a minute later while another keeps blocks nobody asked for in ten.

Here the eviction term is weighted by the value of the blocks the worker's LRU would give up: the oldest ones.
The policy keeps, per worker, the router hashes of the prompts it routed there in the order they were last used (a
shadow of the engine's LRU: the index's prediction for the worker chosen tells it where each request went; trimmed
to the blocks the worker reports cached), and values a block last used ``a`` seconds ago at ``tau / (tau + a)``,
where ``tau`` is the typical age at which a prompt found its prefix again on its worker (a geometric running mean
of the reuse ages it sees). Evicting blocks nobody touched for many ``tau`` costs almost nothing; evicting blocks
used just now costs what ``kv-aware-flat`` charges. So new prefixes go where the coldest blocks are -- the fleet
evicts as one LRU would -- and everything else is ``kv-aware-flat``'s cost. Until a reuse has been seen,
the values are 1 (``kv-aware-flat`` exactly).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Sequence

from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores, cached_credit
from infera.router.kv_ttft import KvTtftPolicy, evicted_blocks

REUSE_EMA = 0.02  # weight of each new reuse age in the running mean of log ages (~50 reuses of memory)
PRUNE_EVERY = 1024  # decisions between sweeps that drop the recency lists of workers the index has forgotten


class KvEvictPolicy(KvTtftPolicy):
    """``kv-aware`` (in the sweeps ``kv-aware-evict``): ``kv-aware-flat`` (:class:`KvTtftPolicy`) whose eviction term is
    weighted by the recency of the blocks evicted."""

    def __init__(self, deps: PolicyDeps) -> None:
        super().__init__(deps)
        self._recency: dict[str, OrderedDict[int, float]] = {}  # per worker: hash -> last use (policy clock, s)
        self._pending: tuple[RoutingContext, float] | None = None  # the previous decision, placed at the next
        self._log_tau: float | None = None  # running mean of log(reuse age in s)
        self._now = 0.0
        self._decisions = 0

    @property
    def tau(self) -> float | None:
        """The typical reuse age in seconds, or None before any reuse was seen."""
        return math.exp(self._log_tau) if self._log_tau is not None else None

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        self._now = self._clock()
        self._decisions += 1
        if self._decisions % PRUNE_EVERY == 0:
            self._prune()
        self._place_previous(candidates)
        scores = super().score(ctx, candidates)
        self._pending = (ctx, self._now)
        return scores

    def _prune(self) -> None:
        """Drop the recency lists of workers that left (the index forgot them): a fleet that churns would keep
        every departed worker's list, ~100 bytes per block it once cached, for the router's life."""
        known = set(self._index.workers())
        for wid in [w for w in self._recency if w not in known]:
            del self._recency[wid]

    def _place_previous(self, candidates: Sequence[Candidate]) -> None:
        """Record the previous request's blocks as used on the worker it went to: the worker whose index entry
        (a prediction made at routing, or blocks confirmed since) holds its last block."""
        if self._pending is None:
            return
        ctx, when = self._pending
        self._pending = None
        sizes = {c.worker.kv_block_size for c in candidates}
        for size in sizes:
            hashes = ctx.hashes(size)
            if not hashes:
                continue
            # the workers holding its last block (a chain hash: its whole prefix) hold the prompt: one block's query
            for wid in self._index.overlaps(hashes[-1:], now=self._now, use_predicted=True):
                self._touch(wid, hashes, when)

    def _touch(self, wid: str, hashes: Sequence[int], when: float) -> None:
        lru = self._recency.get(wid)
        if lru is None:
            lru = self._recency[wid] = OrderedDict()
        # C-level passes (a Python step per block cost ~2x kv-aware-flat's CPU per decision at 16-token blocks): take
        # the prompt's blocks out, note their oldest last use, put them back at the young end
        oldest = min(map(lru.pop, hashes, itertools.repeat(math.inf)), default=math.inf)
        lru.update(zip(hashes, itertools.repeat(when)))
        if oldest < when:  # one sample per request: the age of its prefix's last use here
            x = math.log(when - oldest)
            self._log_tau = x if self._log_tau is None else self._log_tau + REUSE_EMA * (x - self._log_tau)
        excess = len(lru) - max(self._index.block_count(wid), len(hashes))  # the engine holds no more than this
        if excess > 0:
            deque(map(lru.popitem, itertools.repeat(False, excess)), maxlen=0)

    def tail_value(self, wid: str, blocks: int) -> float:
        """Value (0..1) of the ``blocks`` least recently used blocks of ``wid``: tau / (tau + age) of the middle one
        of them, found by a C-level skip (the mean over every block cost a Python step per block and candidate: +20 %
        of the simulator's CPU at 16 workers, for the same placement within noise); blocks it knows nothing of (the
        cache holds more than the prompts it saw) count 1."""
        tau = self.tau
        if tau is None or blocks <= 0:
            return 1.0
        lru = self._recency.get(wid)
        if not lru:
            return 1.0
        known = min(blocks, len(lru))
        last: float = next(itertools.islice(lru.values(), known // 2, None))
        return (known * tau / (tau + max(0.0, self._now - last)) + (blocks - known)) / blocks

    def terms(self, ctx: RoutingContext, cand: Candidate, overlap: int) -> tuple[float, float, float, float, float,
                                                                                  float, float, float]:
        prefill, batch, memory, horizon, eviction, stall, occupancy, duplication = super().terms(ctx, cand, overlap)
        if eviction > 0.0 and self.tau is not None:
            worker = cand.worker
            wid, size = worker.instance_id, worker.kv_block_size
            credit = cached_credit(self._index, wid, ctx.hashes(size), overlap) if overlap else 0
            own = max(0.0, ctx.prompt_tokens - credit * size)
            need = -(-int(own) // size) + -(-ctx.max_tokens // size)
            evicted = evicted_blocks(need, self._index.block_count(wid), cand.active_blocks, worker.capacity.kv_blocks)
            eviction *= self.tail_value(wid, evicted)
        return prefill, batch, memory, horizon, eviction, stall, occupancy, duplication
