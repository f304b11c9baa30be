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

The shadow and the value run in C when the index does (``infera.kv._native``: a ``U64Map(False)`` per worker kept in
LRU order by ``recency_touch``, the value computed inside ``kv_terms``, issue 15's eighth round); :class:`PyShadow` is
the pure path, the same operations on an OrderedDict (tests/router/test_kv_evict_native.py: the same to the bit).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.protocols.worker import WorkerRecord
from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores
from infera.router.kv_ttft import _FLOOR_MODES, MAX_RELATIVE_SCALE, MIN_SAMPLES, SCALE_DEAD_BAND, KvTtftPolicy

REUSE_EMA = 0.02  # weight of each new reuse age in the running mean of log ages (~50 reuses of memory)
PRUNE_EVERY = 1024  # decisions between sweeps that drop the recency lists of workers the index has forgotten


class PyShadow:
    """One worker's recency shadow on the pure path: router hash -> last use (policy clock, s), least recent first
    (the C path's ``U64Map(False)`` with ``recency_touch`` / ``recency_value`` / ``recency_items``)."""

    __slots__ = ("lru",)

    def __init__(self) -> None:
        self.lru: OrderedDict[int, float] = OrderedDict()

    def touch(self, hashes: Sequence[int], when: float, limit: int) -> float:
        """Move ``hashes`` (in their order) to the young end with last use ``when``, then keep the ``limit`` most
        recent; the oldest last use they had (inf if none was there)."""
        lru = self.lru
        # C-level passes (a Python step per block cost ~2x kv-aware-flat's CPU per decision at 16-token blocks): take
        # the prompt's blocks out, note their oldest last use, put them back at the young end
        oldest = min(map(lru.pop, hashes, itertools.repeat(math.inf)), default=math.inf)
        lru.update(zip(hashes, itertools.repeat(when)))
        excess = len(lru) - limit
        if excess > 0:
            deque(map(lru.popitem, itertools.repeat(False, excess)), maxlen=0)
        return oldest

    def value(self, blocks: int, tau: float, now: float) -> float:
        """Value (0..1) of the ``blocks`` least recently used blocks: tau / (tau + age) of the middle one of them,
        found by a C-level skip; blocks it knows nothing of (the cache holds more than the prompts it saw) count 1."""
        lru = self.lru
        if blocks <= 0 or not lru:
            return 1.0
        known = min(blocks, len(lru))
        last: float = next(itertools.islice(lru.values(), known // 2, None))
        return (known * tau / (tau + max(0.0, now - last)) + (blocks - known)) / blocks

    def items(self) -> list[tuple[int, float]]:
        return list(self.lru.items())


def _py_touch(shadow: PyShadow, hashes: Sequence[int], when: float, limit: int) -> float:
    return shadow.touch(hashes, when, limit)


def _py_value(shadow: PyShadow, blocks: int, tau: float, now: float) -> float:
    return shadow.value(blocks, tau, now)


def _py_items(shadow: PyShadow) -> list[tuple[int, float]]:
    return shadow.items()


class KvEvictPolicy(KvTtftPolicy):
    """``kv-aware`` (in the sweeps ``kv-aware-evict``): ``kv-aware-flat`` (:class:`KvTtftPolicy`) whose eviction term is
    weighted by the recency of the blocks evicted (the weight is applied in :meth:`KvTtftPolicy.terms`, from
    ``_recency_args``)."""

    def __init__(self, deps: PolicyDeps) -> None:
        super().__init__(deps)
        native = self._index.native
        if native is not None and not hasattr(native, "recency_touch"):  # an extension built before the shadow was
            native = None  # in C: the shadow in Python, and so the terms too (C's kv_terms would not take it)
            self._c_terms = self._c_score = None
        self._new_shadow: Any = PyShadow if native is None else (lambda: native.U64Map(False))
        self._touch_shadow: Any = _py_touch if native is None else native.recency_touch
        self._shadow_items: Any = _py_items if native is None else native.recency_items
        if native is not None:
            self._recency_value = native.recency_value
        else:
            self._recency_value = _py_value
        self._recency: dict[str, Any] = {}  # per worker: its shadow (a U64Map(False) in C, else a PyShadow)
        self._pending: tuple[RoutingContext, float] | None = None  # the previous decision, placed at the next
        self._log_tau: float | None = None  # running mean of log(reuse age in s)
        self._now = 0.0
        self._decisions = 0
        # the whole decision in one C call from the worker records (issue 15's twelfth round: Picker builds no
        # Candidate and the score's Python glue runs in C; the same calls and doubles, see score_workers) for this
        # class's own cost only: a subclass (bench/cost_sweep.py's variants), a studied knob or an extension built
        # before kv_decide keeps the candidates' path
        self._c_decide: Any = None
        floor_mode = _FLOOR_MODES.get(self.stay_floor)
        if native is not None and hasattr(native, "kv_decide") and type(self) is KvEvictPolicy and \
                self._c_score is not None and floor_mode is not None and not self.stay_fair and \
                not self.busy_occupancy and not self.progress_busy:
            self._c_decide = native.kv_decide
        self._decide_cfg: tuple[Any, ...] | None = None  # kv_decide's cfg, built at its first call
        # the workers' record values (id, block size, capacity) kv_decide read on its last candidates' list, kept in C
        # for the next decision on the same list (csrc/decide20.c: [list, packed values, their objects])
        self._decide_facts: list[Any] = [None, None, None]

    @property
    def tau(self) -> float | None:
        """The typical reuse age in seconds, or None before any reuse was seen."""
        return math.exp(self._log_tau) if self._log_tau is not None else None

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        now = self._now = self._clock()
        self._decisions += 1
        if self._decisions % PRUNE_EVERY == 0:
            self._prune()
        if self._pending is not None:
            self._place_previous(candidates)
        log_tau = self._log_tau
        self._recency_args = (self._recency, math.exp(log_tau), now) if log_tau is not None else None
        scores = super().score(ctx, candidates)
        self._pending = (ctx, now)
        return scores

    def score_workers(self, ctx: RoutingContext, workers: Sequence[WorkerRecord], load: LoadTracker) -> Scores | None:
        """:meth:`score` of the candidates :class:`~infera.router.pick.Picker` would build from ``workers`` with the
        load tracker ``load``, in one C call (``_native.kv_decide``): the same reads, clock readings, shadow touches
        and doubles in the same order. None, having done nothing, where that call does not apply (the pure path, a
        subclass, another tracker than this policy's, a worker holding blocks below the device): the caller scores
        the candidates."""
        decide = self._c_decide
        if decide is None or load is not self._load:
            return None
        cfg = self._decide_cfg
        if cfg is None:
            index, tracker = self._index, self._load
            cfg = self._decide_cfg = (  # in kv_decide's order (csrc/index.c, helper pick14's block)
                self._clock, index.held, index.holding, index.block_count, index.overlaps_and_confirmed,
                tracker.ttft_samples, tracker.prefill_tokens, tracker.active_blocks, tracker.decoding, self._refresh,
                self._recency, self._new_shadow, self._scales, self._confirmed_best, self._prune, self._weight,
                self.horizon, self.eviction_weight, self._occupancy, self.stay_margin, _FLOOR_MODES[self.stay_floor],
                MIN_SAMPLES, SCALE_DEAD_BAND, MAX_RELATIVE_SCALE, REUSE_EMA, PRUNE_EVERY, *self._decide_tables(),
                RoutingContext, self._decide_facts)
        got = decide(self, ctx, workers if type(workers) is list else list(workers), cfg)
        if got is None:
            return None
        return Scores(got[0], got[2], got[1])

    def _decide_tables(self) -> tuple[Any, Any, Any, Any]:
        """kv_decide's last four: the load tracker's cells, the index's worker tables and :meth:`_sum_window`, read in
        C instead of calling their methods (issue 15's fourteenth round: ~5 Python frames a worker), and the index's
        :meth:`~infera.kv.index.PrefixIndex.decide_parts` (its ``holding`` and ``overlaps_and_confirmed``' one walk in
        C, the fifteenth round), where the tracker and the index are the plain classes on their C paths (a subclass may
        answer otherwise); else None each."""
        load, index = self._load, self._index
        cells = load._load if type(load) is LoadTracker and load._cells else None
        plain = type(index) is PrefixIndex and index.native is not None
        tables = index._workers if plain else None
        fallback = self._sum_window if cells is not None and self._c_refresh is not None else None
        return cells, tables, fallback, index.decide_parts() if plain else None

    def shadow(self, wid: str) -> list[tuple[int, float]]:
        """``wid``'s recency shadow: (router hash, last use), least recently used first (tests, diagnostics)."""
        shadow = self._recency.get(wid)
        return [] if shadow is None else list(self._shadow_items(shadow))

    def _prune(self) -> None:
        """Drop the recency lists of workers that left (the index forgot them): a fleet that churns would keep
        every departed worker's list, ~100 bytes per block it once cached, for the router's life."""
        known = set(self._index.workers())
        for wid in [w for w in self._recency if w not in known]:
            del self._recency[wid]

    def _place_previous(self, candidates: Sequence[Candidate]) -> None:
        """Record the previous request's blocks as used on the worker it went to: the worker whose index entry
        (a prediction made at routing, or blocks confirmed since) holds its last block."""
        assert self._pending is not None
        ctx, when = self._pending
        self._pending = None
        sizes = {c.worker.kv_block_size for c in candidates}
        for size in sizes:
            hashes = ctx.hashes(size)
            if not hashes:
                continue
            # the workers holding its last block (a chain hash: its whole prefix) hold the prompt
            for wid in self._index.holding(hashes[-1], now=self._now):
                self._touch(wid, hashes, when)

    def _touch(self, wid: str, hashes: Sequence[int], when: float) -> None:
        shadow = self._recency.get(wid)
        if shadow is None:
            shadow = self._recency[wid] = self._new_shadow()
        # the engine holds no more than it reports cached: older entries were evicted
        oldest = self._touch_shadow(shadow, hashes, when, max(self._index.block_count(wid), len(hashes)))
        if oldest < when:  # one sample per request: the age of its prefix's last use here
            x = math.log(when - oldest)
            self._log_tau = x if self._log_tau is None else self._log_tau + REUSE_EMA * (x - self._log_tau)

    def tail_value(self, wid: str, blocks: int) -> float:
        """Value (0..1) of the ``blocks`` least recently used blocks of ``wid`` at this decision's time: tau / (tau +
        age) of the middle one of them (the mean over every block cost a Python step per block and candidate: +20 %
        of the simulator's CPU at 16 workers, for the same placement within noise); blocks it knows nothing of (the
        cache holds more than the prompts it saw) count 1; 1 before any reuse was seen."""
        tau = self.tau
        shadow = self._recency.get(wid)
        if tau is None or shadow is None:
            return 1.0
        value: float = self._recency_value(shadow, blocks, tau, self._now)
        return value
