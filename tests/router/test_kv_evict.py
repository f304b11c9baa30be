"""kv-aware (KvEvictPolicy): a new prefix goes where the blocks it evicts are the least recently used of the fleet.

Once every worker's cache is full, ``kv-aware-flat``'s eviction term is the same everywhere; ``kv-aware`` weights
it by the recency of the blocks the worker's LRU would give up (bench/README.md, "Seventh round (helper place7)"),
so the fleet evicts as one LRU would.
"""

from __future__ import annotations

import itertools

from infera.kv.hashing import block_hashes
from infera.protocols.kv_events import BlockStored, EventBatch
from infera.protocols.worker import Capacity, WorkerRecord
from infera.router import kv_evict
from infera.router.base import Candidate, RoutingContext, Scores
from infera.router.kv_evict import KvEvictPolicy
from infera.router.kv_ttft import KvTtftPolicy
from infera.router.policies import POLICIES
from tests.router.test_kv_ttft import BS, Fleet, tokens

CAPACITY = 64  # blocks per worker: two 32-block sessions fill it
SMALL = [WorkerRecord(instance_id=f"w{k}", model="m", http_url="http://x", kv_block_size=BS,
                      capacity=Capacity(kv_blocks=CAPACITY)) for k in range(2)]
_salt = itertools.count()


def _cands(fleet: Fleet) -> list[Candidate]:
    return [Candidate(w, fleet.load.in_flight(w.instance_id), fleet.load.prefill_tokens(w.instance_id),
                      fleet.load.active_blocks(w.instance_id)) for w in fleet.workers]


def _score(fleet: Fleet, toks: list[int]) -> tuple[RoutingContext, Scores]:
    ctx = RoutingContext(model="m", token_ids=toks, prompt_tokens=len(toks), max_tokens=32)
    return ctx, fleet.policy.score(ctx, _cands(fleet))


def place(fleet: Fleet, toks: list[int], wid: str, store: bool = True) -> None:
    """A decision (the policy scores it) that the router sent to ``wid``: its prediction, then, when they are new
    there, its blocks confirmed by the engine (fresh engine hashes, so sessions on one worker do not collide)."""
    _score(fleet, toks)
    hashes = block_hashes(toks, BS)
    fleet.index.predict(wid, hashes, ttl=120.0, now=fleet.now)
    if not store:
        return
    salt = next(_salt)
    engine = [hash((wid, salt, k)) & 0xFFFF_FFFF for k in range(len(hashes))]
    fleet.index.apply(wid, EventBatch(ts=0.0, events=[BlockStored(
        block_hashes=engine, parent_block_hash=None, token_ids=toks[: len(hashes) * BS], block_size=BS)]))


def full_fleet(policy: type[KvTtftPolicy]) -> Fleet:
    """Two full workers (64 blocks each): w0's blocks were all used at t=95, w1's oldest half at t=0.
    A returning session at t=10 (w1) and t=95 (w0) makes the typical reuse age ~10 s."""
    fleet = Fleet(policy, SMALL)
    a, b, c, d = (tokens(s, 32 * BS) for s in (1, 2, 3, 4))
    place(fleet, a, "w1")
    place(fleet, d, "w1")
    place(fleet, b, "w0")
    fleet.now = 10.0
    place(fleet, a, "w1", store=False)  # reused after 10 s (its blocks are cached there)
    fleet.now = 95.0
    place(fleet, b, "w0", store=False)  # reused after 95 s
    place(fleet, c, "w0")
    fleet.now = 100.0
    return fleet


def test_a_new_prefix_evicts_the_fleets_least_recently_used_blocks() -> None:
    """Both caches full, both workers idle: kv-aware-flat's eviction term is equal and the tie goes to w0, which
    evicts blocks used 5 s ago; kv-aware sends the prompt to w1, whose LRU gives up blocks unused for 100 s."""
    new = tokens(9, 20 * BS)
    assert full_fleet(KvTtftPolicy).pick(new) == "w0"
    fleet = full_fleet(KvEvictPolicy)
    assert fleet.index.block_count("w0") == fleet.index.block_count("w1") == CAPACITY
    assert fleet.pick(new) == "w1"
    policy = fleet.policy
    assert isinstance(policy, KvEvictPolicy)
    tau = policy.tau
    assert tau is not None and 10.0 < tau < 12.0  # the geometric running mean of the two reuse ages
    # the 22 blocks w1 would evict (20 of prompt, 2 of output) were used at t=0: tau / (tau + 100)
    assert abs(policy.tail_value("w1", 22) - tau / (tau + 100.0)) < 1e-9
    assert abs(policy.tail_value("w0", 22) - tau / (tau + 5.0)) < 1e-9


def test_without_a_reuse_seen_the_cost_is_kv_awares() -> None:
    """Until a prompt has found its prefix again, every block's value is 1: the costs are kv-aware-flat's to the bit."""
    costs = []
    for policy in (KvTtftPolicy, KvEvictPolicy):
        fleet = Fleet(policy, SMALL)
        place(fleet, tokens(1, 40 * BS), "w0")
        place(fleet, tokens(2, 40 * BS), "w1")
        fleet.now = 50.0
        costs.append(_score(fleet, tokens(3, 30 * BS))[1].costs)
    assert costs[0] == costs[1]


def test_kv_aware_is_the_eviction_aware_cost_and_the_flat_one_keeps_its_name() -> None:
    assert POLICIES["kv-aware"] is KvEvictPolicy and POLICIES["kv-aware-flat"] is KvTtftPolicy


def test_the_recency_shadow_follows_where_requests_went_and_what_the_engine_keeps() -> None:
    """The policy learns where the previous request went from the index (its prediction covers the whole prompt),
    and keeps no more of a worker's blocks than the engine reports cached (older ones were evicted)."""
    fleet = Fleet(KvEvictPolicy, SMALL)
    policy = fleet.policy
    assert isinstance(policy, KvEvictPolicy)
    first, second = tokens(1, 40 * BS), tokens(2, 40 * BS)
    place(fleet, first, "w1")
    fleet.now = 5.0
    _score(fleet, second)  # resolves the first: it went to w1
    shadow = policy.shadow("w1")
    assert [h for h, _ in shadow] == block_hashes(first, BS) and {t for _, t in shadow} == {0.0}
    assert "w0" not in policy._recency and policy.shadow("w0") == []


def test_a_departed_workers_recency_list_is_dropped() -> None:
    """A worker the index forgot (it left the fleet) loses its recency list at the next sweep; the others keep
    theirs, so a churning fleet does not grow the policy's memory without bound."""
    fleet = Fleet(KvEvictPolicy, SMALL)
    for s in range(3):
        place(fleet, tokens(10 + s, 8 * BS), f"w{s % 2}")
    policy = fleet.policy
    assert isinstance(policy, KvEvictPolicy)
    assert set(policy._recency) == {"w0", "w1"}
    fleet.index.remove_worker("w1")
    for _ in range(kv_evict.PRUNE_EVERY):
        _score(fleet, tokens(99, 8 * BS))
    assert set(policy._recency) == {"w0"}
