"""The kv-aware policies decide the same on the C path (``infera.kv._native``: the index's walks, one walk for the
predicted and the confirmed overlap, the load tracker's block counts) as on the pure-Python path: random fleets,
KV-event streams, prompts and load, every decision's costs (to the bit), reason and overlaps compared."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.hashing import block_hashes
from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker, Ticket
from infera.kv.native import load as load_native
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from infera.protocols.worker import Capacity, WorkerRecord
from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores
from infera.router.policies import POLICIES

pytestmark = pytest.mark.skipif(load_native() is None, reason="the C extension infera.kv._native is not built")

BS = 4
KV_POLICIES = sorted(name for name, cls in POLICIES.items() if name.startswith("kv-aware"))
# three families of prompts sharing a system prompt (blocks 0-3), two sharing more (blocks 0-7)
PROMPTS = [[1000 + t for t in range(4 * BS)] + [f * 100 + t for t in range(8 * BS + f)] for f in range(6)]
for _p in PROMPTS[1:3]:
    _p[: 8 * BS] = PROMPTS[0][: 8 * BS]


class Side:
    """One path's router bookkeeping around a policy (the index, the load tracker, the policy)."""

    def __init__(self, native: bool, policy: str, workers: list[WorkerRecord], one_call: bool = True) -> None:
        self.now = 0.0
        self.workers = workers
        self.index = PrefixIndex(native=native)
        self.load = LoadTracker(clock=lambda: self.now, native=native)
        self.policy: Any = POLICIES[policy](PolicyDeps(self.index, 1.0, lambda w: w == "w1", self.load,
                                                       lambda: self.now))
        if not one_call:  # as an extension built before kv_score: the C terms one call per candidate
            self.policy._c_score = None
        self.tickets: list[Ticket] = []

    def decide(self, prompt: list[int], max_tokens: int) -> tuple[Scores, list[float]]:
        ctx = RoutingContext(model="m", token_ids=prompt, prompt_tokens=len(prompt), max_tokens=max_tokens)
        load = self.load
        cands = [Candidate(w, load.in_flight(w.instance_id), load.prefill_tokens(w.instance_id),
                           load.active_blocks(w.instance_id)) for w in self.workers]
        scores = self.policy.score(ctx, cands)
        return scores, list(getattr(self.policy, "stay_added", []))

    def route(self, prompt: list[int], max_tokens: int, scores: Scores) -> None:
        """Account the cheapest (the first on a tie) as the router does: a ticket and the prompt predicted."""
        i = min(range(len(scores.costs)), key=scores.costs.__getitem__)
        w = self.workers[i]
        hashes = block_hashes(prompt, BS)
        overlap = scores.overlap_blocks[i] if scores.overlap_blocks else 0
        tail = -(-(len(prompt) - len(hashes) * BS + max_tokens) // BS)
        self.tickets.append(self.load.begin(w.instance_id, max(0, len(prompt) - overlap * BS), hashes, tail))
        self.index.predict(w.instance_id, hashes, ttl=3.0, now=self.now)


def _events(wid: int, prompt: int, start: int, n: int, remove: bool, medium: str = "GPU") -> EventBatch:
    tokens = PROMPTS[prompt]
    end = min(len(tokens) // BS, start + n)
    engine = [hash((wid, tuple(tokens[: (j + 1) * BS]))) & (2**63 - 1) for j in range(start, end)]
    if remove:
        return EventBatch(1.0, [BlockRemoved([h]) for h in engine])
    parent = None if start == 0 else hash((wid, tuple(tokens[: start * BS]))) & (2**63 - 1)
    return EventBatch(1.0, [BlockStored(engine, parent, tokens[start * BS : end * BS], BS, medium=medium)])


route = st.tuples(st.just("route"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 40))
# a later start needs its parent stored before (else its blocks are orphans)
store = st.tuples(st.just("store"), st.integers(0, 5), st.integers(0, len(PROMPTS) - 1),
                  st.sampled_from([0, 0, 0, 4, 8]), st.integers(1, 12), st.sampled_from(["GPU", "GPU", "GPU", "CPU"]))
op = st.one_of(
    route, route, store, store,
    st.tuples(st.just("first"), st.integers(0, 30), st.floats(0.001, 0.5)),
    st.tuples(st.just("end"), st.integers(0, 30)),
    st.tuples(st.just("evict"), st.integers(0, 5), st.integers(0, len(PROMPTS) - 1), st.integers(0, 11),
              st.integers(1, 4)),
    st.tuples(st.just("clear"), st.integers(0, 5)),
    st.tuples(st.just("tick"), st.sampled_from([0.25, 1.0, 4.0])),
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KV_POLICIES), st.integers(2, 6), st.lists(st.sampled_from([0, 24, 64, 4096]), min_size=6,
                                                                   max_size=6), st.lists(op, min_size=10, max_size=80))
def test_every_decision_is_the_same_on_both_paths(policy: str, n_workers: int, capacities: list[int],
                                                  ops: list[tuple[Any, ...]]) -> None:
    workers = [WorkerRecord(instance_id=f"w{k}", model="m", http_url="http://x", kv_block_size=BS,
                            capacity=Capacity(kv_blocks=capacities[k])) for k in range(n_workers)]
    c, py, loop = Side(True, policy, workers), Side(False, policy, workers), Side(True, policy, workers, False)
    assert c.index._native is not None and py.index._native is None and loop.policy._c_score is None
    for o in ops:
        if o[0] == "route":
            prompt = PROMPTS[o[1]]
            got, want, looped = c.decide(prompt, o[2]), py.decide(prompt, o[2]), loop.decide(prompt, o[2])
            assert got == want == looped, (policy, o)
            for side, scores in ((c, got[0]), (py, want[0]), (loop, looped[0])):
                side.route(prompt, o[2], scores)
            continue
        for side in (c, py, loop):
            if o[0] == "first" and side.tickets:
                side.now += o[2]
                side.load.prefill_done(side.tickets[o[1] % len(side.tickets)])
            elif o[0] == "end" and side.tickets:
                side.load.end(side.tickets.pop(o[1] % len(side.tickets)))
            elif o[0] in ("store", "evict") and o[1] < n_workers:
                side.index.apply(f"w{o[1]}", _events(o[1], o[2], o[3], o[4], o[0] == "evict", *o[5:]), now=1.0)
            elif o[0] == "clear" and o[1] < n_workers:
                side.index.apply(f"w{o[1]}", EventBatch(1.0, [AllBlocksCleared()]), now=1.0)
            elif o[0] == "tick":
                side.now += o[1]


class _Index:
    """What the cost's terms read from the index: lower-tier blocks (a fractional credit) and the cached count."""

    def __init__(self, native: Any, lower: int, cached: int) -> None:
        self.native, self._lower, self._cached = native, lower, cached

    def lower_tier_blocks(self, worker_id: str, hashes: Any, count: int) -> dict[str, int]:
        return {"CPU": min(self._lower, count)} if self._lower else {}

    def block_count(self, worker_id: str) -> int:
        return self._cached


class _Load:
    def __init__(self, decoding: int) -> None:
        self._decoding = decoding

    def decoding(self, worker_id: str) -> int:
        return self._decoding


@settings(max_examples=600, deadline=None)
@given(st.integers(0, 40_000), st.integers(0, 3_000), st.integers(0, 50), st.sampled_from([1, 4, 16, 64]),
       st.integers(0, 60_000), st.integers(0, 20_000), st.integers(0, 80), st.sampled_from([0, 1, 50, 700, 20_000]),
       st.integers(1, 5_000), st.one_of(st.just(1), st.floats(0.05, 5.0)), st.integers(0, 30_000),
       st.floats(1.0, 2.0), st.sampled_from(KV_POLICIES))
def test_the_terms_in_c_are_the_same_doubles(prompt_tokens: int, overlap: int, lower: int, size: int, queued: int,
                                             active: int, decoding: int, capacity: int, max_tokens: int,
                                             weight: float, cached: int, busy: float, policy: str) -> None:
    """Every term of every kv-aware cost on one candidate, C against Python, over the whole range the arithmetic
    has branches for: prompts and queues past a step (8192 tokens), an overlap past the prompt, a fractional credit
    from lower-tier blocks, a full cache (memory wait, eviction), unknown capacity, an int weight."""
    cls = POLICIES[policy]
    if cls is POLICIES["kv-aware-blocks"]:
        return
    worker = WorkerRecord(instance_id="w0", model="m", http_url="http://x", kv_block_size=size,
                          capacity=Capacity(kv_blocks=capacity))
    cand = Candidate(worker, decoding + 1, queued, active)
    ctx = RoutingContext(model="m", token_ids=None, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    sides = []
    for native in (load_native(), None):
        pol: Any = cls(PolicyDeps(_Index(native, lower, cached), weight, lambda w: False,  # type: ignore[arg-type]
                                  _Load(decoding), lambda: 0.0))  # type: ignore[arg-type]
        pol._occupancy = pol.occupancy_weight * busy  # as busy_occupancy moves it
        sides.append(pol)
    c, py = sides
    if c._c_terms is None:  # a studied knob: Python's terms on both paths
        assert type(c).terms is type(py).terms
        return
    got, want = c.terms(ctx, cand, overlap), py.terms(ctx, cand, overlap)
    assert py._c_terms is None
    assert got == want and [type(x) for x in got] == [float] * 8, (got, want)


def test_the_c_terms_run_only_with_this_step_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """kv_terms has the step model's constants compiled in: a cost whose constants differ computes in Python."""
    index = PrefixIndex(native=True)
    deps = PolicyDeps(index, 1.0, lambda w: False, LoadTracker(native=True))
    assert POLICIES["kv-aware"](deps)._c_terms is not None  # type: ignore[attr-defined]
    monkeypatch.setattr("infera.router.kv_ttft.PREFILL", (4.2e-7, 0.0152, 16.5))
    assert POLICIES["kv-aware"](deps)._c_terms is None  # type: ignore[attr-defined]


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 60_000), st.integers(0, 80), st.integers(0, 30_000), st.sampled_from([0, 1, 50, 700, 20_000]))
def test_a_samples_modelled_time_in_c_is_the_same_double(tokens: int, decoding: int, active: int,
                                                         capacity: int) -> None:
    """The speed scale's denominator: kv_modelled against kv_ttft.modelled_ms(1.0, ...)."""
    from infera.router.kv_ttft import modelled_ms

    native = load_native()
    assert native is not None
    assert native.kv_modelled(tokens, decoding, active, capacity) == modelled_ms(1.0, tokens, decoding, active,
                                                                                 capacity)
