"""Block pool and scheduler invariants under random workloads (no processes, no clocks)."""

from __future__ import annotations

import collections
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from infera.engine.mock.cache import BlockPool
from infera.engine.mock.hashing import event_hash, extend_digests
from infera.engine.mock.scheduler import Scheduler
from infera.engine.mock.sequence import Sequence
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent


class EventMirror:
    """What a consumer of the KV events believes the engine caches (a multiset of hashes)."""

    def __init__(self) -> None:
        self.held: collections.Counter[int] = collections.Counter()

    def apply(self, events: list[KvEvent]) -> None:
        for ev in events:
            if isinstance(ev, BlockStored):
                assert len(ev.token_ids) == ev.block_size * len(ev.block_hashes)
                self.held.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    assert self.held[h] > 0, "removed a block that was never announced"
                    self.held[h] -= 1
                self.held += collections.Counter()  # drop zeros
            elif isinstance(ev, AllBlocksCleared):
                self.held.clear()


def check_invariants(sched: Scheduler, mirror: EventMirror) -> None:
    pool = sched.pool
    holders: collections.Counter[int] = collections.Counter()
    for seq in sched.running:
        assert len({b.block_id for b in seq.blocks}) == len(seq.blocks)
        holders.update(b.block_id for b in seq.blocks)
        assert seq.num_cached_blocks <= len(seq.blocks)
        for i in range(seq.num_cached_blocks):
            assert seq.blocks[i].digest == seq.digests[i]
        assert len(seq.blocks) * pool.block_size >= seq.num_computed
    for seq in sched.waiting:
        assert not seq.blocks
    used = 0
    for block in pool.blocks[1:]:
        assert block.ref_cnt >= 0
        assert block.ref_cnt == holders[block.block_id]
        assert pool.is_free(block) == (block.ref_cnt == 0)
        used += block.ref_cnt > 0
    assert pool.blocks[0].ref_cnt == 0 and not pool.is_free(pool.blocks[0])  # the null block
    assert used + pool.num_free == pool.num_usable
    assert len(sched.running) <= sched.max_num_seqs
    mirror.apply(pool.take_events())
    cached = collections.Counter(event_hash(b.digest) for b in pool.blocks if b.digest is not None)
    assert mirror.held == cached, "every stored block is either cached or announced removed"


op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 40), st.integers(1, 12), st.integers(0, 10**6)),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 100)),
    st.tuples(st.just("reset")),
)


@settings(max_examples=150, deadline=None)
@given(
    block_size=st.integers(1, 5),
    num_blocks=st.integers(4, 30),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(1, 40),
    ops=st.lists(op, max_size=60),
)
def test_pool_and_scheduler_invariants(block_size: int, num_blocks: int, max_num_seqs: int, budget: int,
                                       ops: list[tuple[object, ...]]) -> None:
    pool = BlockPool(num_blocks, block_size)
    sched = Scheduler(pool, max_num_seqs, budget)
    mirror = EventMirror()
    prefixes = [[random.Random(k).randrange(50) for _ in range(40)] for k in range(4)]
    seqs: list[Sequence] = []
    for item in ops:
        kind = item[0]
        if kind == "add":
            _, k, plen, out, salt = item
            assert isinstance(k, int) and isinstance(plen, int) and isinstance(out, int) and isinstance(salt, int)
            shared = plen // 2 if salt % 3 else plen  # some prompts are pure prefixes of others
            tail = [random.Random(salt).randrange(50) for _ in range(plen - shared)]
            prompt = prefixes[k][:shared] + tail
            if -(-(len(prompt) + out) // block_size) > pool.num_usable:
                continue  # the API refuses what can never fit
            seq = Sequence(request_id=str(len(seqs)), tokens=list(prompt), output_ids=list(range(100, 100 + out)))
            seqs.append(seq)
            sched.add(seq)
        elif kind == "step":
            for _ in range(int(item[1])):  # type: ignore[call-overload]
                if sched.has_work():
                    sched.update(sched.schedule())
                    check_invariants(sched, mirror)
        elif kind == "abort" and seqs:
            sched.abort(seqs[int(item[1]) % len(seqs)])  # type: ignore[call-overload]
        elif kind == "reset":
            assert pool.reset() == (pool.num_free == pool.num_usable)
        check_invariants(sched, mirror)
    # Liveness: with no new work, everything finishes and the whole cache is free again.
    for _ in range(10_000):
        if not sched.has_work():
            break
        sched.update(sched.schedule())
        check_invariants(sched, mirror)
    assert not sched.has_work()
    assert pool.num_free == pool.num_usable
    for seq in seqs:
        assert seq.finished
        if seq.done_sampling:
            assert seq.tokens[seq.prompt_len:] == seq.output_ids


def test_prefix_hit_is_capped_and_counted() -> None:
    pool = BlockPool(16, 4)
    sched = Scheduler(pool, 8, 100)
    first = Sequence(request_id="a", tokens=list(range(12)), output_ids=[7, 8])
    sched.add(first)
    while sched.has_work():
        sched.update(sched.schedule())
    # 12 tokens are 3 full blocks, but the last prompt token is always recomputed: 2 blocks hit.
    again = Sequence(request_id="b", tokens=list(range(12)), output_ids=[9])
    longer = Sequence(request_id="c", tokens=[*range(12), 1, 2, 3], output_ids=[9])
    sched.add(again)
    sched.add(longer)
    sched.update(sched.schedule())
    assert again.cached_tokens == 8
    assert longer.cached_tokens == 12
    assert sched.prefix_hits == 20 and sched.prefix_queries == 12 + 12 + 15


def test_eviction_is_tail_first_and_partial_blocks_are_reused_first() -> None:
    pool = BlockPool(6, 2)  # 5 usable
    sched = Scheduler(pool, 8, 100)
    a = Sequence(request_id="a", tokens=[1, 2, 3, 4, 5], output_ids=[0])  # blocks A1 A2 + partial
    sched.add(a)
    sched.update(sched.schedule())
    digests: list[bytes] = []
    extend_digests(digests, [1, 2, 3, 4], 2)
    pool.take_events()
    b = Sequence(request_id="b", tokens=[9, 9, 8, 8, 7, 7, 6], output_ids=[0])  # needs 4 blocks
    sched.add(b)
    sched.schedule()
    # The partial block and the two never-used blocks come first; then A2 (the tail) goes, A1 stays.
    removed = [ev for ev in pool.take_events() if isinstance(ev, BlockRemoved)]
    assert [ev.block_hashes for ev in removed] == [[event_hash(digests[1])]]
    assert pool.lookup(digests) and len(pool.lookup(digests)) == 1
