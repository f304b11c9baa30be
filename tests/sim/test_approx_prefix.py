"""The approximate text-prefix policy (sglang-router cache_aware's rules) on its own."""

from __future__ import annotations

import random

from infera.kv.index import PrefixIndex
from infera.protocols.worker import WorkerRecord
from infera.router.approx_prefix import GRANULE, ApproxPrefixPolicy, PrefixTrees
from infera.router.base import Candidate, PolicyDeps, RoutingContext
from infera.router.policies import POLICIES


def _tokens(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 1 << 17) for _ in range(n)]


def _cands(loads: list[int]) -> list[Candidate]:
    return [Candidate(WorkerRecord(instance_id=f"w{i}", model="m", http_url="http://x", kv_block_size=16), n, 0, 0)
            for i, n in enumerate(loads)]


def _ctx(tokens: list[int]) -> RoutingContext:
    return RoutingContext(model="m", token_ids=tokens, prompt_tokens=len(tokens), max_tokens=16)


def _policy() -> ApproxPrefixPolicy:
    return ApproxPrefixPolicy(PolicyDeps(PrefixIndex(), 1.0, lambda w: False))


def _chosen(policy: ApproxPrefixPolicy, tokens: list[int], loads: list[int]) -> tuple[int, str]:
    scores = policy.score(_ctx(tokens), _cands(loads))
    low = min(scores.costs)
    assert scores.costs.count(low) == 1  # a strict choice: the tree was updated for exactly this worker
    return scores.costs.index(low), scores.reason


def test_registered_by_name_and_needs_tokens() -> None:
    assert POLICIES["approx-prefix"] is ApproxPrefixPolicy and ApproxPrefixPolicy.needs_tokens


def test_a_repeated_prefix_follows_its_worker_and_new_ones_go_to_the_smallest_tree() -> None:
    policy = _policy()
    a, b = _tokens(1, 1000), _tokens(2, 1000)
    assert _chosen(policy, a + _tokens(3, 50), [0, 0, 0]) == (0, "smallest-tree")
    assert _chosen(policy, b + _tokens(4, 50), [1, 0, 0]) == (1, "smallest-tree")
    assert _chosen(policy, a + _tokens(5, 50), [1, 1, 0]) == (0, "cache-hit")
    assert _chosen(policy, b + _tokens(6, 50), [2, 1, 0]) == (1, "cache-hit")


def test_a_match_at_or_below_the_threshold_does_not_count() -> None:
    policy = _policy()
    shared = _tokens(1, 3 * GRANULE)
    _chosen(policy, shared + _tokens(2, 7 * GRANULE), [0, 0])  # to w0
    # 3 of 10 pieces match: 0.3 is not above the 0.3 threshold -> the smallest tree (w1)
    assert _chosen(policy, shared + _tokens(3, 7 * GRANULE), [0, 0]) == (1, "smallest-tree")
    # 3 of 9 pieces: 0.33 > 0.3 -> both hold them now; the first of the longest matches wins
    assert _chosen(policy, shared + _tokens(4, 6 * GRANULE), [0, 0]) == (0, "cache-hit")


def test_imbalance_overrides_the_cache() -> None:
    policy = _policy()
    a = _tokens(1, 1000)
    _chosen(policy, a, [0, 0])
    # 70 - 2 > 64 and 70 > 2 * 1.5: imbalanced -> the least loaded, though w0 holds the prefix
    assert _chosen(policy, a, [70, 2]) == (1, "imbalanced")
    # 66 - 2 = 64 is not above the absolute threshold: cache affinity again
    assert _chosen(policy, a, [66, 2]) == (0, "cache-hit")
    # 200 - 150 = 50 is under the absolute threshold, 200 < 150 * 1.5 anyway
    assert _chosen(policy, a, [200, 150])[1] == "cache-hit"


def test_trees_evict_least_recently_routed_pieces_by_size() -> None:
    trees = PrefixTrees(max_tokens=4 * GRANULE)
    trees.insert("w0", [1, 2, 3])
    trees.insert("w1", [1, 2])
    assert trees.matches([1, 2, 3, 9]) == {"w0": 3, "w1": 2}
    trees.insert("w0", [7, 8])  # 5 pieces, over 4: piece 1, the least recently routed, goes
    assert trees.size("w0") == 4 * GRANULE
    assert trees.matches([1, 2, 3]) == {"w1": 2}
