"""A paged KV-block pool with prefix caching, modelled on vLLM v1's ``BlockPool``.

Blocks are ids ``0..num_blocks-1``; block 0 is reserved as vLLM's null block, so
``num_blocks - 1`` are usable. A block is *cached* when it holds a full block of tokens and
its chained digest is registered in the hash map; cached blocks outlive their request and
can be hit by a later prompt with the same prefix.

The free queue decides what gets reused (and so evicted) first, as in vLLM 0.32:
allocation pops from the head; a finished request's blocks are released tail-first, the
cached ones *appended* (LRU: the oldest and the chain roots are evicted last) and the
uncached ones (partial blocks) *prepended*, so they are reused before any cached block is
evicted. Evicting a cached block emits one ``BlockRemoved``; caching new full blocks emits
one ``BlockStored`` per call; ``reset`` emits ``AllBlocksCleared``. Events wait in
:meth:`take_events` until the engine publishes them with its next step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from infera.engine.mock.hashing import event_hash
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

MEDIUM = "GPU"  # what vLLM reports, even on its CPU backend
SPEC_KIND = "full_attention"


class Block:
    __slots__ = ("block_id", "digest", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.digest: bytes | None = None  # set while the block is cached

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, cached={self.digest is not None})"


class BlockPool:
    """Reference-counted KV blocks with a digest -> block map and vLLM's free-queue order."""

    def __init__(self, num_blocks: int, block_size: int, *, events: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError("the pool needs at least 2 blocks (block 0 is the null block)")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.num_usable = num_blocks - 1
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self._cached: dict[bytes, dict[int, Block]] = {}
        self._events_on = events
        self._events: list[KvEvent] = []

    # -- queries ---------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks in the free queue: never used, partial leftovers, or cached but unreferenced."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks referenced by live requests (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / self.num_usable

    def num_cached(self) -> int:
        return sum(len(v) for v in self._cached.values())

    def cached_hashes(self) -> set[int]:
        """Event ids of every cached block (what a consumer of the events should hold)."""
        return {event_hash(d) for d in self._cached}

    def is_free(self, block: Block) -> bool:
        return block.block_id in self._free

    def lookup(self, digests: Sequence[bytes]) -> list[Block]:
        """The cached blocks matching the longest prefix of ``digests``."""
        hit: list[Block] = []
        cached = self._cached
        for digest in digests:
            found = cached.get(digest)
            if not found:
                break
            for block in found.values():  # any holder of the digest will do
                hit.append(block)
                break
        return hit

    # -- mutations -------------------------------------------------------------------------

    def touch(self, blocks: Sequence[Block]) -> None:
        """Reference prefix-hit blocks; an unreferenced one leaves the free queue (it is no longer evictable)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[Block]:
        """Pop ``n`` blocks from the head of the free queue, evicting cached ones. Caller checks ``num_free``."""
        if n > len(self._free):
            raise ValueError(f"asked for {n} blocks, {len(self._free)} free")
        out: list[Block] = []
        for _ in range(n):
            block_id, _none = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.digest is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: Block) -> None:
        digest = block.digest
        assert digest is not None
        same = self._cached[digest]
        del same[block.block_id]
        if not same:
            del self._cached[digest]
        block.digest = None
        if self._events_on:
            self._events.append(BlockRemoved(block_hashes=[event_hash(digest)], medium=MEDIUM, group_idx=0))

    def cache_full_blocks(
        self, blocks: Sequence[Block], digests: Sequence[bytes], tokens: Sequence[int], num_cached: int, num_full: int
    ) -> None:
        """Register ``blocks[num_cached:num_full]`` (now full) under their digests; one BlockStored for them."""
        if num_full <= num_cached:
            return
        for i in range(num_cached, num_full):
            block = blocks[i]
            digest = digests[i]
            block.digest = digest
            self._cached.setdefault(digest, {})[block.block_id] = block
        if self._events_on:
            bs = self.block_size
            self._events.append(BlockStored(
                block_hashes=[event_hash(d) for d in digests[num_cached:num_full]],
                parent_block_hash=event_hash(digests[num_cached - 1]) if num_cached > 0 else None,
                token_ids=list(tokens[num_cached * bs:num_full * bs]),
                block_size=bs,
                lora_id=None,
                medium=MEDIUM,
                lora_name=None,
                extra_keys=[None] * (num_full - num_cached),
                group_idx=0,
                kv_cache_spec_kind=SPEC_KIND,
            ))

    def free(self, blocks: Sequence[Block]) -> None:
        """Release a request's blocks (in request order); see the module doc for the queue order."""
        released: list[Block] = []
        for block in reversed(blocks):
            if block.ref_cnt <= 0:
                raise ValueError(f"{block!r} freed more often than referenced")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                released.append(block)
        uncached = [b for b in released if b.digest is None]
        for block in released:
            if block.digest is not None:
                self._free[block.block_id] = None
        for block in reversed(uncached):  # the request's last block ends up at the head
            self._free[block.block_id] = None
            self._free.move_to_end(block.block_id, last=False)

    def reset(self) -> bool:
        """Forget every cached block (vLLM's ``reset_prefix_cache``); refused while any block is in use."""
        if len(self._free) != self.num_usable:
            return False
        for same in self._cached.values():
            for block in same.values():
                block.digest = None
        self._cached.clear()
        if self._events_on:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events
