"""A host-memory KV tier behind the device blocks, filled by kvd prewarm hints.

The tier is an LRU of block digests (vLLM's chained sha256, :mod:`infera.engine.mock.hashing`)
holding at most ``capacity`` blocks. A prewarm walks a prompt's leading full blocks:

1. blocks already cached on the device are warm: nothing to do;
2. the rest are *staged* in host memory (as vLLM's CPU offloading stores them: one
   ``BlockStored`` with medium ``"CPU"`` per contiguous run; a block pushed out of the LRU
   emits ``BlockRemoved`` with medium ``"CPU"``), as if the daemon had pulled them from its
   backing store;
3. after ``promote_seconds`` per block, they are *promoted*: copied onto free device blocks
   and registered in the device's prefix cache (``BlockStored``, medium ``"GPU"``), left
   unreferenced and evictable like the blocks of a finished request. The next request with
   that prefix is then a plain device cache hit.

The host copy stays after promotion, so when the device later evicts the block the router
still sees it in host memory (and gives it partial credit). A request that finds its prefix
only in host memory recomputes it: only hints promote.

Same event-loop thread as the engine: :meth:`promote` runs without awaiting, so no
scheduler step interleaves with it.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence

from infera.engine.mock.cache import SPEC_KIND, Block, BlockPool
from infera.engine.mock.hashing import event_hash
from infera.protocols.kv_events import BlockRemoved, BlockStored, KvEvent

MEDIUM = "CPU"  # what vLLM's offloading connector reports for host memory


@dataclasses.dataclass
class HostTierStats:
    blocks_staged: int = 0  # blocks copied into host memory
    blocks_promoted: int = 0  # blocks copied from host memory onto the device
    blocks_already_warm: int = 0  # hinted blocks that were cached on the device already
    blocks_evicted: int = 0  # host blocks pushed out of the LRU

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class HostTier:
    def __init__(self, pool: BlockPool, capacity: int, promote_seconds: float, *, events: bool = True) -> None:
        """``promote_seconds``: modelled time to copy one block from host memory to the device."""
        self.pool = pool
        self.capacity = capacity
        self.promote_seconds = promote_seconds
        self.stats = HostTierStats()
        self._blocks: OrderedDict[bytes, None] = OrderedDict()  # LRU: oldest first
        self._events_on = events
        self._events: list[KvEvent] = []

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._blocks

    def hashes(self) -> set[int]:
        """Event ids of every block in host memory."""
        return {event_hash(d) for d in self._blocks}

    def take_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    def device_prefix(self, digests: Sequence[bytes]) -> int:
        """How many leading blocks of ``digests`` are cached on the device now."""
        return len(self.pool.lookup(digests))

    def stage(self, digests: Sequence[bytes], tokens: Sequence[int], start: int) -> int:
        """Put ``digests[start:]`` in host memory (at most ``capacity`` of them, from ``start``).

        Returns the end index of the staged run. Blocks already there are refreshed (MRU).
        """
        end = min(len(digests), start + self.capacity)
        bs = self.pool.block_size
        run_start: int | None = None
        for i in range(start, end):
            digest = digests[i]
            if digest in self._blocks:
                self._blocks.move_to_end(digest)
                if run_start is not None:
                    self._stored(digests, tokens, run_start, i, bs)
                    run_start = None
                continue
            self._blocks[digest] = None
            self.stats.blocks_staged += 1
            if run_start is None:
                run_start = i
        if run_start is not None:
            self._stored(digests, tokens, run_start, end, bs)
        while len(self._blocks) > self.capacity:  # never this chain's blocks: they are the newest
            old, _ = self._blocks.popitem(last=False)
            self.stats.blocks_evicted += 1
            if self._events_on:
                self._events.append(BlockRemoved(block_hashes=[event_hash(old)], medium=MEDIUM, group_idx=0))
        return end

    def _stored(self, digests: Sequence[bytes], tokens: Sequence[int], lo: int, hi: int, bs: int) -> None:
        if not self._events_on:
            return
        self._events.append(BlockStored(
            block_hashes=[event_hash(d) for d in digests[lo:hi]],
            parent_block_hash=event_hash(digests[lo - 1]) if lo > 0 else None,
            token_ids=list(tokens[lo * bs:hi * bs]),
            block_size=bs,
            lora_id=None,
            medium=MEDIUM,
            lora_name=None,
            extra_keys=[None] * (hi - lo),
            group_idx=0,
            kv_cache_spec_kind=SPEC_KIND,
        ))

    def promote(self, digests: Sequence[bytes], tokens: Sequence[int], end: int) -> int:
        """Copy the host-resident blocks of ``digests[:end]`` after the device prefix onto the device.

        Stops at the first block not in host memory (the chain would break) or when the device
        has no free block. Returns the number of blocks promoted.
        """
        pool = self.pool
        hit = pool.lookup(digests[:end])
        k = len(hit)
        want = 0
        for digest in digests[k:end]:
            if digest not in self._blocks:
                break
            want += 1
        if want == 0:
            return 0
        pool.touch(hit)  # referenced: allocation below cannot evict the prefix it extends
        n = min(want, pool.num_free)
        blocks: list[Block] = list(hit)
        if n > 0:
            blocks.extend(pool.allocate(n))
            pool.cache_full_blocks(blocks, digests, tokens, k, k + n)
        pool.free(blocks)  # unreferenced and cached: evictable, like a finished request's blocks
        self.stats.blocks_promoted += n
        return n
