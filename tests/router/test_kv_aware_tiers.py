"""Lower-tier KV blocks: the index tracks them per worker; the kv-aware cost credits them partially."""

from __future__ import annotations

from infera.kv.hashing import block_hashes
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import BlockRemoved, BlockStored, EventBatch
from infera.protocols.worker import WorkerRecord
from infera.router.base import TIER_CREDIT, Candidate, PolicyDeps, RoutingContext
from infera.router.kv_aware import KvAwarePolicy

BS = 4
TOKENS = list(range(100, 132))  # 8 blocks


def stored(engine_hashes: list[int], tokens: list[int], medium: str, parent: int | None = None) -> EventBatch:
    return EventBatch(ts=0.0, events=[BlockStored(block_hashes=engine_hashes, parent_block_hash=parent,
                                                  token_ids=tokens, block_size=BS, medium=medium)])


def removed(engine_hashes: list[int], medium: str) -> EventBatch:
    return EventBatch(ts=0.0, events=[BlockRemoved(block_hashes=engine_hashes, medium=medium)])


def test_the_index_lists_blocks_held_only_below_the_device() -> None:
    index = PrefixIndex()
    hashes = block_hashes(TOKENS, BS)
    engine = list(range(1, 9))
    index.apply("w", stored(engine, TOKENS, "GPU"))
    assert index.lower_tier_blocks("w", hashes, 8) == {}
    assert index.held("w") == (8, False)
    index.apply("w", stored(engine[:4], TOKENS[:16], "CPU"))  # offloaded copies of the first 4
    assert index.lower_tier_blocks("w", hashes, 8) == {}  # still on the device too
    assert index.held("w") == (8, False)
    index.apply("w", removed(engine[:3], "GPU"))  # the device evicted 3 of them
    assert index.lower_tier_blocks("w", hashes, 8) == {"CPU": 3}
    assert index.held("w") == (index.block_count("w"), True)
    assert index.lower_tier_blocks("w", hashes, 2) == {"CPU": 2}
    assert index.overlaps(hashes) == {"w": 8}  # still held, in some tier
    index.apply("w", stored(engine[:1], TOKENS[:4], "GPU"))  # promoted back
    assert index.lower_tier_blocks("w", hashes, 8) == {"CPU": 2}
    index.apply("w", removed(engine[1:3], "CPU"))  # gone from host memory too
    assert index.lower_tier_blocks("w", hashes, 8) == {}
    assert index.held("w") == (index.block_count("w"), False)
    assert index.overlaps(hashes) == {"w": 1}
    index.remove_worker("w")
    assert index.lower_tier_blocks("w", hashes, 8) == {}
    assert index.held("w") == (0, False)


def test_host_memory_blocks_earn_three_quarters_of_a_device_block() -> None:
    index = PrefixIndex()
    index.apply("gpu", stored(list(range(1, 9)), TOKENS, "GPU"))
    index.apply("cpu", stored(list(range(11, 19)), TOKENS, "CPU"))
    policy = KvAwarePolicy(PolicyDeps(index=index, kv_overlap_weight=1.0, blind=lambda _: False))
    workers = [WorkerRecord(instance_id=w, model="m", http_url="http://x", kv_block_size=BS) for w in ("cpu", "gpu")]
    ctx = RoutingContext(model="m", token_ids=TOKENS, prompt_tokens=len(TOKENS), max_tokens=1)
    scores = policy.score(ctx, [Candidate(w, 0, 0, 0) for w in workers])
    assert scores.overlap_blocks == [8, 8]
    assert scores.costs[1] == 0.0  # all 8 blocks on the device: nothing left to prefill
    assert abs(scores.costs[0] - 8 * (1 - TIER_CREDIT["CPU"])) < 1e-9  # 8 blocks at 0.75 credit
