"""kv-aware's decision in one C call (``_native.kv_decide`` behind ``KvEvictPolicy.score_workers``, issue 15's twelfth
round) decides what the candidates' path decides: random fleets (mixed block sizes, capacities, lower-tier blocks,
workers that leave the index or the pool, evictions, ties, temperature) through two :class:`Picker`s, one taking the
one call and one building candidates for ``KvEvictPolicy.score``, compared decision by decision: the choice (worker,
reason, overlap, cost to the bit), the costs, overlaps and stay floor, the recency shadows and tau, the clock readings
(a clock that moves at every reading), the statistics and the random draws consumed."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker, Ticket
from infera.kv.native import load as load_native
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from infera.protocols.worker import Capacity, WorkerRecord
from infera.router import kv_evict
from infera.router.base import PolicyDeps, RoutingContext
from infera.router.kv_evict import KvEvictPolicy
from infera.router.pick import Choice, Picker, RouterStats
from infera.router.policies import POLICIES

pytestmark = pytest.mark.skipif(load_native() is None, reason="the C extension infera.kv._native is not built")

SIZES = (4, 8)
# three families of prompts sharing a system prompt, two sharing more; long enough for 8-token blocks too
PROMPTS = [[1000 + t for t in range(16)] + [f * 100 + t for t in range(40 + f)] for f in range(6)]
for _p in PROMPTS[1:3]:
    _p[:40] = PROMPTS[0][:40]


class Side:
    """One router's bookkeeping around a kv-aware Picker: the one-call path (``one_call``) or the candidates'."""

    def __init__(self, one_call: bool, workers: list[WorkerRecord], temperature: float, seed: int) -> None:
        self.base = 0.0
        self.reads = 0
        self.workers = workers
        self.index = PrefixIndex(native=True)
        self.load = LoadTracker(clock=self.clock, native=True)
        self.policy: Any = POLICIES["kv-aware"](PolicyDeps(self.index, 1.0, lambda w: False, self.load, self.clock))
        assert type(self.policy) is KvEvictPolicy
        if not one_call:
            self.policy._c_decide = None
        self.stats = RouterStats()
        self.rng = random.Random(seed)
        self.picker = Picker(self.index, self.load, self.stats, temperature, self.rng)
        self.tickets: list[Ticket] = []

    def clock(self) -> float:
        """Time moves a little at every reading: a reading more, fewer or in another order shows in what expires."""
        self.reads += 1
        return self.base + self.reads * 0.01

    def pick(self, prompt: list[int], max_tokens: int, pool: list[WorkerRecord]) -> tuple[Any, ...]:
        ctx = RoutingContext(model="m", token_ids=prompt, prompt_tokens=len(prompt), max_tokens=max_tokens)
        choice: Choice = self.picker.pick(ctx, pool, self.policy, "kv-aware")
        wid = choice.worker.instance_id
        size = choice.worker.kv_block_size
        hashes = ctx.hashes(size)
        tail = -(-(len(prompt) - len(hashes) * size + max_tokens) // size)
        self.tickets.append(self.load.begin(wid, max(0, len(prompt) - choice.overlap * size), hashes, tail))
        self.index.predict(wid, hashes, ttl=0.3, now=self.clock())
        pol = self.policy
        return (wid, choice.reason, choice.overlap, choice.cost.hex(), choice.candidates, list(pol.stay_added),
                pol._log_tau, {w: pol.shadow(w) for w in sorted(pol._recency)},
                dict(pol._confirmed_best), pol._recency_args and pol._recency_args[1:], pol._decisions, self.reads,
                dict(self.stats.decisions), self.rng.getstate())


def _events(wid: int, size: int, prompt: int, start: int, n: int, remove: bool, medium: str) -> EventBatch:
    tokens = PROMPTS[prompt]
    end = min(len(tokens) // size, start + n)
    engine = [hash((wid, tuple(tokens[: (j + 1) * size]))) & (2**63 - 1) for j in range(start, end)]
    if remove:
        return EventBatch(1.0, [BlockRemoved([h]) for h in engine])
    parent = None if start == 0 else hash((wid, tuple(tokens[: start * size]))) & (2**63 - 1)
    return EventBatch(1.0, [BlockStored(engine, parent, tokens[start * size: end * size], size, medium=medium)])


route = st.tuples(st.just("route"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 40), st.integers(0, 63))
store = st.tuples(st.just("store"), st.integers(0, 5), st.integers(0, len(PROMPTS) - 1), st.sampled_from([0, 0, 2]),
                  st.integers(1, 12), st.sampled_from(["GPU", "GPU", "GPU", "GPU", "CPU"]))
op = st.one_of(
    route, route, route, store, store,
    st.tuples(st.just("first"), st.integers(0, 30), st.floats(0.001, 0.5)),
    st.tuples(st.just("end"), st.integers(0, 30)),
    st.tuples(st.just("evict"), st.integers(0, 5), st.integers(0, len(PROMPTS) - 1), st.integers(0, 11),
              st.integers(1, 4)),
    st.tuples(st.just("clear"), st.integers(0, 5)),
    st.tuples(st.just("forget"), st.integers(0, 5)),  # the worker left: the index drops it (its shadow is pruned)
    st.tuples(st.just("forget"), st.integers(0, 2)),
    st.tuples(st.just("tick"), st.sampled_from([0.05, 0.25, 1.0, 4.0])),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.lists(st.sampled_from([0, 16, 48, 4096]), min_size=6, max_size=6),
       st.lists(st.sampled_from(SIZES), min_size=6, max_size=6), st.sampled_from([0.0, 0.0, 0.0, 0.5]),
       st.integers(0, 2**32), st.lists(op, min_size=10, max_size=80))
def test_the_one_call_decides_as_the_candidates_path(n_workers: int, capacities: list[int], sizes: list[int],
                                                     temperature: float, seed: int, ops: list[tuple[Any, ...]]) -> None:
    workers = [WorkerRecord(instance_id=f"w{k}", model="m", http_url="http://x", kv_block_size=sizes[k],
                            capacity=Capacity(kv_blocks=capacities[k])) for k in range(n_workers)]
    fast, slow = Side(True, workers, temperature, seed), Side(False, workers, temperature, seed)
    assert fast.policy._c_decide is not None and slow.policy._c_decide is None
    kv_evict_prune = kv_evict.PRUNE_EVERY
    kv_evict.PRUNE_EVERY = 2  # the shadows' prune runs within a test's decisions (read by both paths at their call)
    try:
        for o in ops:
            if o[0] == "route":
                pool = [w for k, w in enumerate(workers) if o[3] >> k & 1 or k == 0]  # a subset, never empty
                got, want = fast.pick(PROMPTS[o[1]], o[2], pool), slow.pick(PROMPTS[o[1]], o[2], pool)
                assert got == want, o
                continue
            for side in (fast, slow):
                if o[0] == "first" and side.tickets:
                    side.base += o[2]
                    side.load.prefill_done(side.tickets[o[1] % len(side.tickets)])
                elif o[0] == "end" and side.tickets:
                    side.load.end(side.tickets.pop(o[1] % len(side.tickets)))
                elif o[0] in ("store", "evict") and o[1] < n_workers:
                    side.index.apply(f"w{o[1]}", _events(o[1], sizes[o[1]], o[2], o[3], o[4], o[0] == "evict",
                                                         *o[5:], *(("GPU",) if o[0] == "evict" else ())))
                elif o[0] == "clear" and o[1] < n_workers:
                    side.index.apply(f"w{o[1]}", EventBatch(1.0, [AllBlocksCleared()]))
                elif o[0] == "forget" and o[1] < n_workers:
                    side.index.remove_worker(f"w{o[1]}")
                elif o[0] == "tick":
                    side.base += o[1]
    finally:
        kv_evict.PRUNE_EVERY = kv_evict_prune


def test_the_one_call_is_taken_only_for_the_default_cost() -> None:
    """kv-aware's own class on the C path takes the one call; its subclasses (the sweeps' variants), another load
    tracker than the policy's, and the pure path score candidates."""
    index, load = PrefixIndex(native=True), LoadTracker(native=True)
    deps = PolicyDeps(index, 1.0, lambda w: False, load)
    ctx = RoutingContext(model="m", token_ids=PROMPTS[0], prompt_tokens=len(PROMPTS[0]), max_tokens=4)
    workers = [WorkerRecord(instance_id="w0", model="m", http_url="http://x", kv_block_size=4)]
    policy = KvEvictPolicy(deps)
    assert policy.score_workers(ctx, workers, LoadTracker(native=True)) is None
    assert policy._decisions == 0  # nothing done
    assert policy.score_workers(ctx, workers, load) is not None
    variant = type("Variant", (KvEvictPolicy,), {"eviction_weight": 1.0})(deps)
    assert variant.score_workers(ctx, workers, load) is None
    pure = KvEvictPolicy(PolicyDeps(PrefixIndex(native=False), 1.0, lambda w: False, LoadTracker(native=False)))
    assert pure.score_workers(ctx, workers, pure._load) is None


def test_equal_costs_name_the_first_cheapest_for_the_reason() -> None:
    """Two workers of different block sizes holding the same 8 prompt tokens (one 8-token block, two 4-token blocks),
    of unknown capacity and idle: equal costs, different overlaps. The reason is the first cheapest's (``load``: the
    deeper overlap is the second's), on both paths, and the tie is broken by the same draw."""
    workers = [WorkerRecord(instance_id=f"w{k}", model="m", http_url="http://x", kv_block_size=size,
                            capacity=Capacity(kv_blocks=0)) for k, size in enumerate((8, 4))]
    got = []
    for one_call, picker in ((True, False), (True, True), (False, True)):
        side = Side(one_call, workers, 0.0, 7)
        ctx = RoutingContext(model="m", token_ids=PROMPTS[0], prompt_tokens=len(PROMPTS[0]), max_tokens=4)
        side.index.predict("w0", ctx.hashes(8)[:1], ttl=5.0, now=0.0)
        side.index.predict("w1", ctx.hashes(4)[:2], ttl=5.0, now=0.0)
        if not picker:  # the one call's own answer
            scores = side.policy.score_workers(ctx, workers, side.load)
            assert scores.overlap_blocks == [1, 2] and scores.costs[0] == scores.costs[1] and scores.reason == "load"
            continue
        choice = side.picker.pick(ctx, workers, side.policy, "kv-aware")
        got.append((choice.reason, choice.worker.instance_id, choice.overlap, choice.cost.hex(), side.stats.decisions,
                    side.rng.getstate(), side.reads))
    assert got[0] == got[1] and got[0][0] == "load"
