"""Synthetic KV-event streams and fleets for the in-process benchmarks (index, scale).

Events look like vLLM's: a request's prefill stores its new full blocks in one ``BlockStored``
(engine hashes are opaque random 64-bit ids, token ids are real-looking, parents chain), and an
engine whose cache is full removes its least recently stored blocks with one ``BlockRemoved`` per
block. Each worker's stream is consistent on its own (parents are always known), so the index
never sees an orphan.
"""

from __future__ import annotations

import collections
import random
import time
from typing import Any

BLOCK = 16


def token_block(rng: random.Random) -> list[int]:
    return [rng.randrange(1000, 150000) for _ in range(BLOCK)]


class WorkerStream:
    """One worker's event stream: prefixes shared with other workers + unique tails, LRU-bounded."""

    def __init__(self, worker: str, capacity: int, seed: int) -> None:
        self.worker = worker
        self.capacity = capacity
        self.rng = random.Random(seed)
        self.lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # engine hashes, oldest first

    def store(self, prefix: list[list[int]] | None, tail_blocks: int) -> list[Any]:
        """Events for one request: its shared ``prefix`` blocks (each token-id block) then a unique tail."""
        from infera.protocols.kv_events import BlockRemoved, BlockStored

        rng = self.rng
        blocks = [*(prefix or []), *(token_block(rng) for _ in range(tail_blocks))]
        hashes = [rng.getrandbits(64) for _ in blocks]
        events: list[Any] = [BlockStored(hashes, None, [t for b in blocks for t in b], BLOCK)]
        for h in hashes:
            self.lru[h] = None
        while len(self.lru) > self.capacity:
            old, _ = self.lru.popitem(last=False)
            events.append(BlockRemoved([old]))
        return events


def event_batches(n_workers: int, n_requests: int, capacity: int, seed: int = 3,
                  prefix_blocks: int = 64, tail: tuple[int, int] = (4, 32)) -> list[tuple[str, Any]]:
    """(worker, EventBatch) in arrival order: ``n_requests`` requests spread over the workers.

    Half the requests start with one of 64 shared prefixes (``prefix_blocks`` long); the rest are
    unique. Every worker's cache holds at most ``capacity`` blocks (evictions are events too).
    """
    from infera.protocols.kv_events import EventBatch

    rng = random.Random(seed)
    prefixes = [[token_block(rng) for _ in range(prefix_blocks)] for _ in range(64)]
    streams = [WorkerStream(f"w{k}", capacity, seed * 101 + k) for k in range(n_workers)]
    out: list[tuple[str, Any]] = []
    for _ in range(n_requests):
        s = streams[rng.randrange(n_workers)]
        prefix = prefixes[rng.randrange(64)] if rng.random() < 0.5 else None
        events = s.store(prefix, rng.randint(*tail))
        out.append((s.worker, EventBatch(time.time(), events)))
    return out


def block_events(batches: list[tuple[str, Any]]) -> int:
    """Block events in ``batches``: one per stored block and one per removed block."""
    from infera.protocols.kv_events import BlockRemoved, BlockStored

    n = 0
    for _, batch in batches:
        for ev in batch.events:
            if isinstance(ev, BlockStored | BlockRemoved):
                n += len(ev.block_hashes)
    return n


def hot_prompt_index(n_workers: int, prompt_blocks: int, spread: str, seed: int = 5,
                     background: int = 256, index: Any = None) -> tuple[Any, list[list[int]]]:
    """An index where ``n_workers`` hold prefixes of a few long prompts; returns (index, prompts' token ids).

    spread = "few": each prompt's prefix is on 1-4 workers (what kv-aware routing produces);
    spread = "all": every worker holds a prefix of every prompt, of staggered depth (a hot system
    prompt everywhere: the worst case for the query). Each worker also holds ``background``
    unrelated blocks. ``index``: an empty index to fill (default a new ``PrefixIndex``).
    """
    from infera.kv.index import PrefixIndex
    from infera.protocols.kv_events import BlockStored, EventBatch

    rng = random.Random(seed)
    index = PrefixIndex() if index is None else index
    prompts = [[t for _ in range(prompt_blocks) for t in token_block(rng)] for _ in range(4)]
    for k in range(n_workers):
        w = f"w{k}"
        bg = [t for _ in range(background) for t in token_block(rng)]
        events: list[Any] = [BlockStored([rng.getrandbits(64) for _ in range(background)], None, bg, BLOCK)]
        for p, ids in enumerate(prompts):
            if spread == "few" and k not in {(p * 7 + j) % n_workers for j in range(1 + p % 4)}:
                continue
            depth = rng.randint(prompt_blocks // 4, prompt_blocks) if spread == "few" else \
                max(1, int(prompt_blocks * (k + 1) / n_workers))
            events.append(BlockStored([rng.getrandbits(64) for _ in range(depth)], None, ids[: depth * BLOCK],
                                      BLOCK))
        index.apply(w, EventBatch(time.time(), events))
    return index, prompts
