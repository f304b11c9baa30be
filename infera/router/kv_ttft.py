"""KV-aware scoring by predicted time to first token: the ``kv-aware-flat`` policy (issue 14), on which the
default ``kv-aware`` (``infera/router/kv_evict.py``: evictions priced by the recency of the blocks they take) builds.

cost(w) = scale(w) * (kv_overlap_weight * (prefill_ms(w) + eviction_ms(w) + occupancy_ms(w)) + decode_ms(w)),
in modelled ms (``kv_overlap_weight`` keeps its meaning: the weight of prefill work against decode load):

- prefill_ms: the prefill work ahead of this request on w (the uncached prompt tokens of the
  requests routed there that have no first token yet) plus its own uncached part. Its cached
  part counts confirmed blocks (KV events) and the blocks that requests already routed to w
  will have stored by the time it runs (the index's predictions, for every worker, not only
  those whose events are missing). Tokens become time by the shape of the mock engine's step
  model (a*T^2 + b*T + c per step of at most :data:`STEP_TOKENS` tokens).
- decode_ms, the decode load: (1) every step that computes the prompt also decodes w's running
  batch, a*u^2 + b*u + c ms at the worker's KV usage u (active blocks over capacity; nothing
  while w decodes nothing); (2) :data:`DECODE_HORIZON` steps of this request's own output at
  the usage it leaves w at, so that among equal prefill costs the emptier worker wins; (3) when
  w lacks the free blocks to admit it, the wait for running requests to free them.
- scale(w): the worker's own speed, calibrated online from the TTFTs the router observed on
  it (:meth:`infera.kv.load.LoadTracker.ttft_samples`): observed over modelled time for its
  last samples, plus the fleet's fastest request per sample (the fixed cost no model covers), relative
  to the fleet's median, bounded to 1/2..2 and
  typical within 1.5x of the median (a shared host's noise must not move load).

The eviction and occupancy terms price what the request costs the *other* requests on w (issue 14, chosen in
the fleet simulator; ``kv-aware-ttft`` is the cost without them, ``kv-aware-eviction`` without occupancy), and
the stay floor keeps the decode terms from moving a request off the prefix its holder computed:

- eviction: when w's cache is full, the blocks of other prefixes it must evict to fit this
  request's uncached blocks (what is cached beyond w's free blocks, up to what no in-flight
  request pins), priced as :data:`EVICTION_WEIGHT` of recomputing them. Without it, placement
  keeps overflowing the worker that holds a popular first block and evicts live conversations.
- occupancy: :data:`OCCUPANCY_WEIGHT` of this request's own prefill work on w (its uncached tokens,
  without the per-step constant): the time it holds w's steps from the requests that come after it.
  The TTFT alone is one request's view: a returning session whose worker decodes two others
  looked a few ms faster on an idle worker (the decode batch's share of the step and the decode
  horizon at w's higher KV usage), so it moved and recomputed its whole prefix, which then
  delayed whoever came next there, and its copy cost hits (live, multi-turn: 10 such moves of
  120 requests, 5 points of hit ratio; tenants: the second request of a tenant whose prompt was
  still being computed). The term makes a move pay for its recompute; it is the same on every
  worker when nothing is cached, so least-work-first and the spread of unique prompts stay.
- the stay floor (``kv-aware`` since the fourth round; ``kv-aware-occupancy`` is the cost without it): a worker
  short of the longest *confirmed* prefix (blocks the engines reported cached, not the router's predictions)
  gets no advantage from the decode terms (the batch's share and the horizon) over the best worker that holds
  it, unless those holders decode :data:`STAY_MARGIN` or more requests than it does. Those terms are the
  request's own view of a few ms of decode speed; they moved returning sessions whose holder decoded one to
  three others onto an idle worker that recomputed their prefix (the live multi-turn gap to the peers:
  sessions of 1,500-2,400 tokens, 1.6 points of hit ratio in the simulator of the live requests). A
  prefix only predicted (a burst's, still being computed) is not held, so the floor leaves spreading a
  simultaneous burst alone; the margin lets a worker that gathered many sessions shed them (24 agents on
  16 workers).
- busy occupancy (off in ``kv-aware``; on in ``kv-aware-busy``): the occupancy weight rises from
  :data:`OCCUPANCY_WEIGHT` to :data:`BUSY_OCCUPANCY_WEIGHT` with the share of the candidates that have prefill
  queued. The time a recompute holds a worker's steps costs the requests after it only when they wait for it, i.e.
  when the fleet is computing prompts; then a move off a cached prefix must save more. In the simulator
  (bench/README.md, "Fifth round"): on the Mooncake trace at real lengths over 64 busy workers the queue on a prefix
  holder moved 1 in 9 requests, giving up 4 % of the prompt blocks; with the weight rising, hit 87.7 -> 89.3 % of
  the capacity limit and TTFT p90 489 -> 482 ms, and the live requests' tenants reached the peers' hits; live under
  CPU contention it gathered tenants more (TTFT p90 +16 % in two runs, hits equal), so it is not the default yet.
- cold wait (off in ``kv-aware``; on in ``kv-aware-cold``): for a prompt of which no worker
  holds any prefix, prefill is the wait for w's next step (the prompts queued on w are in a step that began when
  the router last saw it start, less what it has run since; with none queued, half a decode step when w decodes)
  plus its own prefill, and there is no decode horizon. In a closed loop the requests that shared a step finish
  together and their successors arrive together; pricing a running step as joinable and "fewest decoding wins"
  sent them back, together, to the worker they had just left (unique prompts' TTFT p50 1.25x round-robin's in
  the simulator of the live requests; 0.99x with it; bench/README.md, "Unique prompts' TTFT p50"). Live the
  unique workload's p50 did not move (130 ms before and after, round-robin 82): the live gap has another cause,
  so it is not the default.
- progress (off: :attr:`KvTtftPolicy.progress`): credit the prefill queued on w with the time w has
  been computing it (``LoadTracker.prefill_age``); measured, it gathered staggered bursts and helped
  tenants, but cost TTFT p90 on bursts in the simulator (bench/README.md); kept for study.
- hold (off in ``kv-aware``; on in ``kv-aware-hold``, with busy occupancy): :data:`HOLD_SHARE` of the same credit,
  only on the workers that hold the longest confirmed prefix. Waiting for the holder is priced by what its queue
  has left, a move by the whole queue where it goes; the Mooncake trace's moves at 64 busy workers were requests
  leaving a holder that was part-way through ~28k queued prompt tokens (bench/README.md, "Sixth round").
- stall (off by default, :data:`STALL_WEIGHT` 0): a share of the modelled prefill already
  queued on w, once more (the queued prompts share steps with w's decoding streams and stall
  them). Measured at 0.05 and 0.2 it changed nothing but a little hit ratio; kept for study.

So a session stays where its blocks are until the queue there costs more than recomputing
its prompt elsewhere, or its holder decodes several requests more than another worker; a burst
on a new prefix gathers on the worker computing it (a request in the same step shares its blocks, as
vLLM's scheduler caches a block when it allocates it) until a second copy is faster even counting its
recompute; with nothing cached it is least-work-first.
The previous cost (blocks of prefill plus blocks held by in-flight requests) is
``kv-aware-blocks`` (:mod:`infera.router.kv_aware`); the cost without the stay floor is
``kv-aware-occupancy``, without the occupancy term too ``kv-aware-eviction``, and without eviction
``kv-aware-ttft``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infera.kv.load import LoadTracker, TtftSample
from infera.protocols.worker import WorkerRecord
from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores, cached_credit

STEP_TOKENS = 8192  # prompt tokens one engine step computes (vLLM's default max_num_batched_tokens)
MAX_RELATIVE_SCALE = 2.0  # a worker counts at most this much slower or faster than the fleet's median
SCALE_DEAD_BAND = 1.5  # closer to the median than this factor: typical (noise, not a slower worker)
MIN_SAMPLES = 8  # TTFT samples before a worker's own speed counts
DECODE_HORIZON = 2  # decode steps of its own output counted at the KV usage it leaves w at (chosen
# by bench/cost_sweep.py: 0-32 tried; 2 kept sessions sticky and spread load best on its workloads)
UNKNOWN_USAGE = 0.5  # KV usage assumed for a worker whose record does not say its capacity
# The shape and default constants of an engine step's time in ms, as the mock engine's
# StepTimeModel (infera.engine.mock.timing, a layer the router may not import): prefill
# a*T^2 + b*T + c for T prompt tokens in the step, decode a*u^2 + b*u + c for KV usage u.
PREFILL = (4.21e-7, 0.0152, 16.5)
DECODE = (-25.74, 54.01, 5.74)
DECODE_FLOOR_MS = 1.0
EVICTION_WEIGHT = 0.5  # share of an evicted block's recompute charged to the request that evicts it
OCCUPANCY_WEIGHT = 0.25  # share of this request's own prefill work charged again: the time it holds w's steps
# from the requests that come after it (chosen in bench/cost_sweep.py over 0.1-4: 0.25 is the least weight that
# kept the tenants' and the live-sized multi-turn sessions where their prefix is; more loses agentic TTFT)
BUSY_OCCUPANCY_WEIGHT = 0.5  # the occupancy weight when every candidate has prefill queued (linear in that share
# from OCCUPANCY_WEIGHT; bench/cost_sweep.py `kv-aware-ob*`: 0.5-2 tried, 1 and more piled the live burst)
HOLD_SHARE = 0.5  # kv-aware-hold: the share of the time a holder has computed its queue that is credited (the
# queue's steps also decode, so the time overstates the prompt tokens done; bench/cost_sweep.py `kv-aware-ob0.5-hp*`:
# 1 reached 91.5 % of the 64-worker capacity limit with TTFT p99 +11 %, 0.5 90.0 % with p90 and p99 kept)
STAY_MARGIN = 4  # decoding requests: the stay floor lets balance move a request off its confirmed prefix only when
# the holders decode this many more than the other worker (bench/cost_sweep.py: 2-4 and a fleet-mean gate tried;
# 4 kept the live-shaped multi-turn sessions put and still spread 24 agents gathered on 16 workers)
STALL_WEIGHT = 0.0  # weight of the stall term (KvTtftPolicy.stall_ms): 0.05 and 0.2 changed no TTFT p90 and
# cost 0.001-0.003 of hit ratio on the Mooncake trace at 16 and 64 workers (bench/README.md), so it is off


def _step_prefill_ms(tokens: float) -> float:
    a, b, c = PREFILL
    return a * tokens * tokens + b * tokens + c


def prefill_ms(tokens: float) -> float:
    """Modelled ms to prefill ``tokens`` uncached tokens, in steps of at most STEP_TOKENS."""
    if tokens <= 0:
        return 0.0
    full, rest = divmod(tokens, STEP_TOKENS)
    return full * _step_prefill_ms(STEP_TOKENS) + (_step_prefill_ms(rest) if rest else 0.0)


def decode_ms(tokens: float, decoding: int, active_blocks: int, capacity: int) -> float:
    """Modelled ms the decoding batch adds to the steps that prefill ``tokens``."""
    if decoding <= 0:
        return 0.0
    usage = min(1.0, active_blocks / capacity) if capacity > 0 else UNKNOWN_USAGE
    steps = max(1, -(-int(tokens) // STEP_TOKENS))
    a, b, c = DECODE
    return steps * max(DECODE_FLOOR_MS, a * usage * usage + b * usage + c)


def memory_wait_ms(blocks: int, capacity: int, max_tokens: int) -> float:
    """Modelled ms before the worker has the KV blocks to admit the request.

    ``blocks``: what its in-flight requests hold plus what this one needs. The overflow must
    wait for running requests to finish: that share of the batch, each decoding about
    ``max_tokens`` steps of a full cache (this request's output length stands for theirs).
    """
    if capacity <= 0 or blocks <= capacity:
        return 0.0
    a, b, c = DECODE
    return (blocks - capacity) / capacity * max_tokens * (a + b + c)


def recompute_ms(tokens: float) -> float:
    """Modelled ms the tokens add to prefill steps that run anyway (no per-step constant)."""
    a, b, _ = PREFILL
    return a * tokens * tokens + b * tokens if tokens > 0 else 0.0


def evicted_blocks(need: int, cached: int, active: int, capacity: int) -> int:
    """Cached blocks of other prefixes a worker must evict to allocate ``need`` new blocks.

    ``cached``: the blocks its cache holds (KV events); ``active``: the blocks its in-flight
    requests hold or will (these count as occupied even before their events arrive, and cannot
    be evicted). Unknown capacity: nothing.
    """
    if capacity <= 0 or need <= 0:
        return 0
    occupied = min(capacity, max(cached, active))
    return max(0, min(need - (capacity - occupied), occupied - min(active, occupied)))


def modelled_ms(weight: float, tokens: float, decoding: int, active_blocks: int, capacity: int) -> float:
    return weight * prefill_ms(tokens) + decode_ms(tokens, decoding, active_blocks, capacity)


_FLOOR_MODES = {"": 0, "decode": 1, "horizon": 2}  # KvTtftPolicy.stay_floor as C's kv_score takes it


class _Scale:
    """Sums over one worker's recent TTFT samples (refreshed when it has new ones)."""

    __slots__ = ("capacity", "count", "floor", "modelled", "n", "observed", "parts", "source")

    def __init__(self) -> None:
        self.count = -1
        self.n = 0
        self.observed = self.modelled = self.floor = 0.0  # ms
        self.capacity = -1  # the worker's KV capacity ``parts`` were modelled at
        self.parts: list[float] = []  # modelled ms per sample, as ``ttft_samples`` orders them
        self.source: object = None  # the sample sequence ``parts`` came from (a worker that left and came back
        # starts a new one)


class KvTtftPolicy:
    needs_tokens = True
    horizon = DECODE_HORIZON
    eviction_weight = EVICTION_WEIGHT
    stall_weight = STALL_WEIGHT
    occupancy_weight = OCCUPANCY_WEIGHT
    stay_floor = "decode"  # these terms cannot pay for leaving a confirmed prefix: "decode" (the batch's share and
    # the horizon), "horizon" (the horizon only; studied), "" (off: ``kv-aware-occupancy``)
    stay_margin = STAY_MARGIN  # ... unless the holders decode at least this many more requests than w (0: never)
    stay_fair = 0.0  # studied, off: ... unless the holders decode more than this many times the fleet's mean
    duplication_weight = 0.0  # studied, off: share of the recompute of a prefix confirmed elsewhere that w lacks
    progress = False  # credit the prefill queued on w with the time w has been computing it
    holder_progress = False  # the same credit, only on the workers holding the longest confirmed prefix
    progress_share = 1.0  # the share of that time credited (studied: the queue's steps also decode)
    progress_busy = False  # the holders' credit scales with the share of the candidates that have prefill queued
    hold_min_queue = 0  # studied: the holders' credit only when more than this many prompt tokens are queued there
    busy_occupancy = 0.0  # the occupancy weight when every candidate has prefill queued (0: the fixed weight;
    # ``kv-aware-busy``: BUSY_OCCUPANCY_WEIGHT)
    cold_wait = False  # a prompt nothing holds any prefix of: the wait for w's next step, no decode horizon
    # (``kv-aware-cold``)

    # kv-aware (infera/router/kv_evict.py) weights the eviction term by the recency of the blocks evicted: per decision
    # (per-worker shadows, tau, now), or None (the weight is 1: this cost exactly); _recency_value(shadow, blocks, tau,
    # now) is that weight (C: ``kv_terms`` computes it from the shadow itself)
    _recency_args: tuple[dict[str, Any], float, float] | None = None
    _recency_value: Callable[[Any, int, float, float], float]

    def __init__(self, deps: PolicyDeps) -> None:
        self._index = deps.index
        self._weight = deps.kv_overlap_weight
        self._load = deps.load if deps.load is not None else LoadTracker()
        self._clock = deps.clock
        self._scales: dict[str, _Scale] = {}
        # the stall term is computed only when it can be other than 0 (its weight, or a variant's own formula)
        self._stall = self.stall_weight != 0.0 or type(self).stall_ms is not KvTtftPolicy.stall_ms
        self._occupancy = self.occupancy_weight  # this decision's occupancy weight (busy_occupancy moves it)
        self._busy = 1.0  # this decision's share of the candidates with prefill queued (when a knob reads it)
        self._confirmed_best: dict[int, int] = {}  # per block size: the longest confirmed prefix, this decision
        self._cold: set[int] = set()  # block sizes at which no worker holds any prefix of this prompt (this decision)
        self.stay_added: list[float] = []  # per candidate, what the stay floor added to its cost (diagnostics)
        # the terms in C (one call per candidate, the same doubles to the bit) when the index runs in C, the cost
        # has none of the studied knobs whose terms only Python computes, and C's step model is this module's
        plain = not (self.cold_wait or self.progress or self.holder_progress or self._stall or self.duplication_weight)
        native = deps.index.native
        model = native is not None and native.kv_terms_model() == (PREFILL, DECODE, STEP_TOKENS, DECODE_FLOOR_MS,
                                                                   UNKNOWN_USAGE)
        self._c_terms = native.kv_terms if model and plain else None
        self._c_modelled = native.kv_modelled if model else None  # a TTFT sample's modelled_ms(1.0, ...)
        self._c_scales = getattr(native, "kv_scales", None)  # _relative_scales' arithmetic (the same doubles)
        # _sums' window refresh and its two sums (an extension built before kv_window: the Python below)
        self._c_window = getattr(native, "kv_window", None) if model else None
        # and the rest of the refresh around it (which samples are new, the fields) in the same call (issue 15's ninth
        # round); an extension built before kv_refresh: the lines of _refresh around kv_window
        self._c_refresh = getattr(native, "kv_refresh", None) if self._c_window is not None else None
        # score gathers the C terms itself unless a subclass computes its own terms (bench/cost_sweep.py's variants)
        self._plain_terms = type(self).terms is KvTtftPolicy.terms
        # the terms, their sums, the stay floor and the costs in one C call per decision (issue 15's ninth round: the
        # Python glue around kv_terms was most of the score) where this is that cost: the plain terms, this class's
        # floor without the studied fairness gate; an extension built before kv_score: the loop below
        self._c_score = getattr(native, "kv_score", None) if self._c_terms is not None and self._plain_terms \
            and type(self)._floor is KvTtftPolicy._floor else None

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        overlaps: list[int] = []
        by_size: dict[int, dict[str, int]] = {}
        self._confirmed_best.clear()
        self._cold.clear()
        for cand in candidates:
            size = cand.worker.kv_block_size
            found = by_size.get(size)
            if found is None:
                now = self._clock()
                if self.duplication_weight or self.stay_floor:  # one walk for both (on the C path)
                    found, best = self._index.overlaps_and_confirmed(ctx.hashes(size), now=now)
                    if found:
                        self._confirmed_best[size] = best
                else:
                    found = self._index.overlaps(ctx.hashes(size), now=now, use_predicted=True)
                by_size[size] = found
                if not found and self.cold_wait:
                    self._cold.add(size)
            overlaps.append(found.get(cand.worker.instance_id, 0))
        self._occupancy = self.occupancy_weight
        self._busy = 1.0
        if (self.busy_occupancy or self.progress_busy) and candidates:
            busy = self._busy = sum(1 for c in candidates if c.prefill_tokens > 0) / len(candidates)
            if self.busy_occupancy:
                self._occupancy += (self.busy_occupancy - self.occupancy_weight) * busy
        scales = self._relative_scales(candidates)
        c_score = self._c_score
        floor_mode = _FLOOR_MODES.get(self.stay_floor)
        if c_score is not None and floor_mode is not None and not self.stay_fair:
            recency = self._recency_args
            shadows, tau, now = recency if recency is not None else (None, 0.0, 0.0)
            got = c_score(candidates if isinstance(candidates, list) else list(candidates), overlaps, self._index.held,
                          self._load.decoding, ctx.prompt_tokens, ctx.max_tokens, self._weight, self.horizon,
                          self.eviction_weight, self._occupancy, shadows, tau, now, self._confirmed_best,
                          self.stay_margin, floor_mode, scales)
            if got is not None:  # else a candidate's credit is fractional (blocks below the device): the loop below
                costs, self.stay_added = got
                return self._scores(costs, overlaps)
        decoding: list[int] | None = None
        if self._c_terms is not None and self._plain_terms:
            terms, sums, decoding = self._c_all_terms(ctx, candidates, overlaps)
        else:
            terms = [self.terms(ctx, cand, overlap) for cand, overlap in zip(candidates, overlaps, strict=True)]
            sums = [sum(t) for t in terms]
        self.stay_added = [0.0] * len(candidates)
        if self.stay_floor and self._confirmed_best:
            self._floor(candidates, overlaps, terms, sums, decoding)
        costs = [scale * total for total, scale in zip(sums, scales, strict=True)]
        return self._scores(costs, overlaps)

    @staticmethod
    def _scores(costs: list[float], overlaps: list[int]) -> Scores:
        best_overlap = max(overlaps, default=0)
        if best_overlap == 0:
            reason = "no-hit"
        else:
            cheapest = costs.index(min(costs))  # the first cheapest, as min(range(n), key=costs.__getitem__)
            reason = "cache-hit" if overlaps[cheapest] == best_overlap else "load"
        return Scores(costs=costs, reason=reason, overlap_blocks=overlaps)

    def terms(self, ctx: RoutingContext, cand: Candidate, overlap: int) -> tuple[float, float, float, float, float,
                                                                                  float, float, float]:
        """The cost's terms on ``cand`` in modelled ms, before the speed scale: prefill (queued + own),
        the decode batch's share of those steps, the wait for free blocks, the decode horizon, eviction,
        stall, occupancy and duplication (their sum is the cost; the diagnostic bench/place_diag.py reads them
        one by one). Call after :meth:`score` for the same decision (duplication reads what it found)."""
        # the terms that come out 0 are not computed (the scoring runs per candidate and request: issue 15)
        worker = cand.worker
        wid = worker.instance_id
        size = worker.kv_block_size
        credit = cached_credit(self._index, wid, ctx.hashes(size), overlap) if overlap else 0
        recency = self._recency_args
        if self._c_terms is not None:
            c_terms: tuple[float, float, float, float, float, float, float, float]
            if recency is None:
                c_terms = self._c_terms(
                    ctx.prompt_tokens, credit, size, cand.prefill_tokens, cand.active_blocks, self._load.decoding(wid),
                    worker.capacity.kv_blocks, ctx.max_tokens, self._weight, self.horizon, self.eviction_weight,
                    self._index.block_count(wid), self._occupancy)
            else:
                c_terms = self._c_terms(
                    ctx.prompt_tokens, credit, size, cand.prefill_tokens, cand.active_blocks, self._load.decoding(wid),
                    worker.capacity.kv_blocks, ctx.max_tokens, self._weight, self.horizon, self.eviction_weight,
                    self._index.block_count(wid), self._occupancy, recency[0].get(wid), recency[1], recency[2])
            return c_terms
        own = max(0.0, ctx.prompt_tokens - credit * size)
        decoding = self._load.decoding(wid)
        capacity = worker.capacity.kv_blocks
        queued, active = cand.prefill_tokens, cand.active_blocks
        tokens = queued + own
        cold = self.cold_wait and size in self._cold
        progress = self.progress or (self.holder_progress and queued > self.hold_min_queue
                                     and overlap >= self._confirmed_best.get(size, 0) > 0)
        age = self._load.prefill_age(wid) * 1000.0 if (progress or cold) and queued else 0.0
        if progress and not cold:
            age *= self.progress_share * (self._busy if self.progress_busy else 1.0)
        # w has computed its queue for ``age`` ms: this request waits for the rest, then its own step; with
        # nothing queued, or queued this very moment, one step computes the queue and this request
        if cold:
            prefill, batch = self._next_step(own, queued, age, decoding, active, capacity)
        else:
            prefill = max(0.0, prefill_ms(queued) - age) + prefill_ms(own) if age > 0.0 else prefill_ms(tokens)
            batch = decode_ms(tokens, decoding, active, capacity)
        prefill *= self._weight
        need = -(-int(own) // size) + -(-ctx.max_tokens // size)
        after = active + need
        memory = memory_wait_ms(after, capacity, ctx.max_tokens)
        horizon = self.horizon * decode_ms(1, 1, after, capacity) if not cold else 0.0
        eviction = 0.0
        if self.eviction_weight and capacity > 0 and need > 0:  # else evicted_blocks is 0
            evicted = evicted_blocks(need, self._index.block_count(wid), active, capacity)
            eviction = self.eviction_weight * self._weight * recompute_ms(evicted * size)
            if recency is not None and eviction > 0.0:
                shadow = recency[0].get(wid)
                if shadow is not None:
                    eviction *= self._recency_value(shadow, evicted, recency[1], recency[2])
        occupancy = self._occupancy * self._weight * recompute_ms(own) if self._occupancy else 0.0
        duplication = 0.0
        if self.duplication_weight:
            copied = self._confirmed_best.get(size, 0) - overlap
            if copied > 0:
                duplication = self.duplication_weight * self._weight * recompute_ms(copied * size)
        stall = self.stall_ms(queued, own, decoding) if self._stall else 0.0
        return prefill, batch, memory, horizon, eviction, stall, occupancy, duplication

    def _c_all_terms(self, ctx: RoutingContext, candidates: Sequence[Candidate], overlaps: list[int]
                     ) -> tuple[list[tuple[float, ...]], list[float], list[int]]:
        """:meth:`terms` of every candidate on the C path, the same call with the same arguments, gathered once per
        decision instead of once per candidate (issue 15: the Python glue around the one C call was most of a
        candidate's cost); with their sums (``sum(terms)``, the cost before the floor and the scale) and each
        candidate's decode batch, which the stay floor reads."""
        c_terms = self._c_terms
        assert c_terms is not None
        index = self._index
        held = index.held
        load_decoding = self._load.decoding
        prompt, max_tokens = ctx.prompt_tokens, ctx.max_tokens
        weight, horizon, eviction, occupancy = self._weight, self.horizon, self.eviction_weight, self._occupancy
        recency = self._recency_args
        out: list[tuple[float, ...]] = []
        sums: list[float] = []
        decoding: list[int] = []
        for cand, overlap in zip(candidates, overlaps, strict=True):
            worker = cand.worker
            wid = worker.instance_id
            size = worker.kv_block_size
            # one index lookup for the cached count and the lower tiers: a worker with no block below the device
            # has cached_credit == overlap (the same int), without the call
            cached, lower = held(wid)
            credit = (cached_credit(index, wid, ctx.hashes(size), overlap) if lower else overlap) if overlap else 0
            d = load_decoding(wid)
            decoding.append(d)
            if recency is None:
                t = c_terms(prompt, credit, size, cand.prefill_tokens, cand.active_blocks, d, worker.capacity.kv_blocks,
                            max_tokens, weight, horizon, eviction, cached, occupancy)
            else:
                t = c_terms(prompt, credit, size, cand.prefill_tokens, cand.active_blocks, d, worker.capacity.kv_blocks,
                            max_tokens, weight, horizon, eviction, cached, occupancy, recency[0].get(wid),
                            recency[1], recency[2])
            out.append(t)
            sums.append(sum(t))
        return out, sums, decoding

    @staticmethod
    def _next_step(own: float, queued: float, age: float, decoding: int, active: int,
                   capacity: int) -> tuple[float, float]:
        """(prefill, batch) for a prompt nothing caches (``cold_wait``): the wait for the worker's next step, then
        its own prefill beside the decode batch. Prompts queued on w are in a step that started ``age`` ms ago
        (an engine with nothing to do starts one at once; a step that runs cannot be joined); with none queued, a
        worker that decodes is half-way through a decode step on average. No decode horizon: among workers that
        all decode, "the fewest decoding wins" sent a closed loop's returning cohort back, together, to the worker
        it had just left (bench/README.md, "Unique prompts' TTFT p50 (helper unique)")."""
        step = decode_ms(1, max(decoding, 1), active, capacity)  # one decode step at w's usage
        if queued > 0:
            wait = max(0.0, prefill_ms(queued) + (step if decoding else 0.0) - age)
            return wait + prefill_ms(own), step  # the queued prompts decode beside it once they have begun
        wait = step / 2 if decoding else 0.0
        return wait + prefill_ms(own), decode_ms(own, decoding, active, capacity)

    def _floor(self, candidates: Sequence[Candidate], overlaps: list[int], terms: Sequence[Sequence[float]],
               sums: list[float], decoding: list[int] | None = None) -> None:
        """The stay floor: a worker short of the longest *confirmed* prefix (blocks the engines reported, not
        predictions) gets no advantage from the decode terms over the best of the workers that hold it, unless
        those holders decode :attr:`stay_margin` or more requests than it does. Adds to ``sums`` in place.
        ``decoding``: each candidate's decode batch if the caller has it (else read here)."""
        # one pass, no comprehension per step (issue 15: six of them were most of the floor's ~5 µs per decision):
        # the candidates short of the longest confirmed prefix at their block size, and over the holders of it
        # (> 0 blocks) the least decode terms and decode batch, as min() finds them (the first least, by <)
        best = self._confirmed_best
        horizon_only = self.stay_floor == "horizon"
        short: list[int] = []
        holders = 0
        floor = 0.0
        held = 0
        for i, cand in enumerate(candidates):
            wanted = best.get(cand.worker.kv_block_size, 0)
            if overlaps[i] < wanted:
                short.append(i)
            elif wanted > 0:
                if decoding is None:
                    decoding = list(map(self._load.decoding, [c.worker.instance_id for c in candidates]))
                # the decode terms: the batch's share (1) and the horizon (3), or the horizon alone; added as sum()
                # adds them (0 + a is a), so the floor is the same to the bit
                t = terms[i]
                part = t[3] if horizon_only else t[1] + t[3]
                if not holders or part < floor:
                    floor = part
                if not holders or decoding[i] < held:
                    held = decoding[i]
                holders += 1
        if not holders or decoding is None:
            return
        if self.stay_fair:
            fair = max(1.0, self.stay_fair * sum(decoding) / len(candidates))
            if held > fair:
                return  # the holders carry more than their share of the fleet's decoding: balance may move it
        margin = self.stay_margin
        for i in short:
            if margin and held - decoding[i] >= margin:
                continue  # the holders decode this many more requests than w: balance may move the request
            t = terms[i]
            mine = t[3] if horizon_only else t[1] + t[3]
            if mine < floor:
                sums[i] += floor - mine
                self.stay_added[i] = floor - mine

    def stall_ms(self, queued: float, own: float, decoding: int) -> float:
        """The stall term: :data:`STALL_WEIGHT` of the prefill already queued on the worker (``queued``
        tokens; ``own`` and ``decoding`` are there for variants under study, bench/cost_sweep.py)."""
        return self.stall_weight * self._weight * prefill_ms(queued)

    def _relative_scales(self, candidates: Sequence[Candidate]) -> list[float]:
        """Each worker's speed relative to the fleet's median (1.0 = typical; 2.0 = twice as slow).

        Bounded by :data:`MAX_RELATIVE_SCALE` either way, and 1.0 within :data:`SCALE_DEAD_BAND`
        of the median, so that the noise of a shared host cannot starve or flood a worker; a worker
        with fewer than :data:`MIN_SAMPLES` samples is typical.
        """
        # a worker without new samples since the last refresh is its kept sums (no call into _refresh); the tracker
        # is asked once per candidate, its answer passed on
        kept, samples_of = self._scales, self._load.ttft_samples
        sums = []
        for c in candidates:
            wid = c.worker.instance_id
            x = kept.get(wid)
            count, samples = samples_of(wid)
            sums.append(x if x is not None and x.count == count else self._refresh(c.worker, wid, count, samples))
        return self._scales_of(sums)

    def _scales_of(self, sums: Sequence[_Scale]) -> list[float]:
        """:meth:`_relative_scales` from the candidates' sums (C's ``kv_scales`` when built: the same doubles)."""
        if self._c_scales is not None:
            scales: list[float] = self._c_scales(sums, MIN_SAMPLES, SCALE_DEAD_BAND, MAX_RELATIVE_SCALE)
            return scales
        floors = [x.floor for x in sums if x.n >= MIN_SAMPLES]
        if not floors:
            return [1.0] * len(sums)
        fixed = min(floors)  # the fleet's fastest request: the fixed cost no model covers
        raw = [x.observed / (x.modelled + x.n * fixed) if x.n >= MIN_SAMPLES and x.modelled + x.n * fixed > 0
               else None for x in sums]
        known = sorted(r for r in raw if r is not None and r > 0.0)
        if not known:
            return [1.0] * len(sums)
        mid = known[len(known) // 2]
        out = []
        for r in raw:
            rel = r / mid if r is not None and r > 0.0 else 1.0
            if 1.0 / SCALE_DEAD_BAND <= rel <= SCALE_DEAD_BAND:
                rel = 1.0
            out.append(min(MAX_RELATIVE_SCALE, max(1.0 / MAX_RELATIVE_SCALE, rel)))
        return out

    def _sums(self, cand: Candidate) -> _Scale:
        """Observed and modelled TTFT over the worker's last samples, and its fastest one."""
        wid = cand.worker.instance_id
        count, samples = self._load.ttft_samples(wid)
        return self._refresh(cand.worker, wid, count, samples)

    def _refresh(self, worker: WorkerRecord, wid: str, count: int, samples: Sequence[TtftSample]) -> _Scale:
        """:meth:`_sums` given what ``ttft_samples(wid)`` answered (``count`` samples ever, the window) for ``worker``
        (whose id is ``wid``)."""
        sums = self._scales.get(wid)
        if sums is None:
            sums = self._scales[wid] = _Scale()
        if sums.count != count:
            capacity = worker.capacity.kv_blocks
            if self._c_refresh is not None:
                load = self._load
                seconds = load.ttft_seconds(wid)
                if self._c_refresh(sums, samples, count, capacity, seconds, load.ttft_fastest(wid)) is None:
                    self._sum_window(sums, seconds)  # an item not a float: sum() adds them, as below
                return sums
            # a sample's modelled time never changes: model only the samples taken since the last refresh (the
            # samples are the worker's last TTFT_SAMPLES, newest last); the sum runs over the same values in the
            # same order as modelling them all, so the cost is the same to the bit
            n = len(samples)
            fresh = sums.source is not samples or sums.capacity != capacity or not 0 <= sums.count <= count
            new = n if fresh else min(n, count - sums.count)
            seconds = self._load.ttft_seconds(wid)  # the samples' seconds, the same floats in the same order
            parts = sums.parts
            c_window = self._c_window
            # C: the trim, the new samples' modelled ms and both sums, as the Python below does them, in the same
            # order (issue 15: ~4 µs of Python per refresh); None when an item is not a float: sum() adds them
            got = c_window(parts, samples, n - new, capacity, seconds) if c_window is not None else None
            if got is not None:
                sums.observed, sums.modelled = got
            else:
                if c_window is None:
                    del parts[:len(parts) - (n - new)]  # keep the last n - new (in place: no copy per refresh)
                    # the new samples, the window's last ``new`` (indexed from the end: a deque's islice walks from
                    # the start)
                    fresh_samples = [samples[i] for i in range(n - new, n)] if new < n else samples
                    c_model = self._c_modelled
                    parts.extend([c_model(x.queued_tokens + x.prefill_tokens, x.decoding, x.active_blocks, capacity)
                                  for x in fresh_samples] if c_model is not None else
                                 [modelled_ms(1.0, x.queued_tokens + x.prefill_tokens, x.decoding, x.active_blocks,
                                              capacity) for x in fresh_samples])
                self._sum_window(sums, seconds)
            sums.capacity = capacity
            sums.source = samples
            sums.count = count
            sums.n = n
            sums.floor = self._load.ttft_fastest(wid) * 1000.0  # min(seconds, default=0.0), kept by the tracker
        return sums

    @staticmethod
    def _sum_window(sums: _Scale, seconds: Sequence[float]) -> None:
        """The two sums by sum() (the Python refresh's, and the C one's when kv_refresh answered None: an item of
        the window not a float)."""
        sums.observed = sum(seconds) * 1000.0
        sums.modelled = sum(sums.parts)


class KvTtftBusyPolicy(KvTtftPolicy):
    """``kv-aware-busy``: the occupancy weight rises with the share of the fleet computing prompts (the fifth
    round's candidate: chosen by the simulator, not yet confirmed live; bench/README.md, "Fifth round")."""

    busy_occupancy = BUSY_OCCUPANCY_WEIGHT


class KvTtftHoldPolicy(KvTtftBusyPolicy):
    """``kv-aware-hold``: ``kv-aware-busy`` that also credits a prefix holder's queue with :data:`HOLD_SHARE` of the
    time the holder has been computing it, so a request waits for its holder while that is faster than recomputing
    elsewhere (bench/README.md, "Sixth round (helper place4)")."""

    holder_progress = True
    progress_share = HOLD_SHARE


class KvTtftColdPolicy(KvTtftPolicy):
    """``kv-aware-cold``: a prompt nothing caches is priced by the wait for the worker's next step, without the
    decode horizon (chosen by the simulator of the live requests; not confirmed live; bench/README.md, "Unique
    prompts' TTFT p50")."""

    cold_wait = True


class KvTtftOccupancyPolicy(KvTtftPolicy):
    """``kv-aware-occupancy``: the cost without the stay floor (the default before it)."""

    stay_floor = ""


class KvTtftEvictionPolicy(KvTtftPolicy):
    """``kv-aware-eviction``: the cost without the occupancy term and the stay floor (the default before them)."""

    occupancy_weight = 0.0
    stay_floor = ""


class KvTtftOnlyPolicy(KvTtftPolicy):
    """``kv-aware-ttft``: the predicted-TTFT cost without the eviction and occupancy terms (the default before
    ``kv-aware-eviction``)."""

    eviction_weight = 0.0
    stall_weight = 0.0
    occupancy_weight = 0.0
    stay_floor = ""
