"""A worker's clear (AllBlocksCleared: vLLM publishes it on a prefix-cache reset) in the prefix index, C path: the
C clear (csrc/index_clear.c) against the Python loop it replaced (the same index with ``_clear_worker`` unset, the
code main ran), in alternating rounds in one process, gc off. Two indexes:

- fleet: 1024 workers x 32k tokens (2048 blocks of 16 each); each worker's first 512 blocks are a prefix its
  group of 32 workers shares (a tenant's system prompt and documents), the rest its own;
- quality: routing_quality's tenants cell, 4 workers x 1789 blocks (its KV capacity), the first 1024 blocks of
  each shared by all 4 (its hit ratio is ~88 %).

Per round each of ``--clears`` workers is cleared (timed: µs of CPU per clear) and stored again (not timed).

    PYTHONPATH=$PWD .venv/bin/python bench/index_clear.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import AllBlocksCleared, BlockStored, EventBatch

BS = 16
CLEAR = EventBatch(1.0, [AllBlocksCleared()])


def _stored(worker: int, group: int, blocks: int, shared: int) -> BlockStored:
    tokens = [(group * 7919 + t) % 50_000 for t in range(shared * BS)]
    tokens += [(worker * 104_729 + t) % 50_000 + 50_000 for t in range((blocks - shared) * BS)]
    return BlockStored([(worker << 32) + j + 1 for j in range(blocks)], None, tokens, BS)


def build(workers: int, blocks: int, shared: int, group: int) -> tuple[PrefixIndex, dict[str, EventBatch]]:
    index = PrefixIndex(block_size=BS, native=True)
    events = {f"w{k}": EventBatch(1.0, [_stored(k, k // group, blocks, shared)]) for k in range(workers)}
    for name, batch in events.items():
        index.apply(name, batch)
    return index, events


def measure(index: PrefixIndex, events: dict[str, EventBatch], names: list[str], c_clear: bool) -> list[float]:
    saved = index._clear_worker
    if not c_clear:
        index._clear_worker = None
    out = []
    gc.disable()
    try:
        for name in names:
            t0 = time.process_time_ns()
            index.apply(name, CLEAR)
            out.append((time.process_time_ns() - t0) / 1e3)
            assert index.block_count(name) == 0
            index.apply(name, events[name])
    finally:
        gc.enable()
        index._clear_worker = saved
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--clears", type=int, default=16, help="workers cleared per round (fleet; quality clears all 4)")
    args = ap.parse_args()
    cases = {"fleet 1024 x 32k tokens": (1024, 2048, 512, 32), "quality 4 x 1789 blocks": (4, 1789, 1024, 4)}
    print(f"{'index':<26}{'Python clear µs':>16}{'C clear µs':>12}{'ratio':>8}   (median of per-round medians, "
          f"{args.rounds} rounds, range)")
    for label, (workers, blocks, shared, group) in cases.items():
        index, events = build(workers, blocks, shared, group)
        names = [f"w{k}" for k in range(0, workers, max(workers // args.clears, 1))][: args.clears]
        got: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for c_clear in ((False, True) if r % 2 == 0 else (True, False)):
                got[c_clear].append(statistics.median(measure(index, events, names, c_clear)))
        py, c = statistics.median(got[False]), statistics.median(got[True])
        print(f"{label:<26}{py:>16.0f}{c:>12.0f}{py / c:>8.1f}   py {min(got[False]):.0f}-{max(got[False]):.0f}, "
              f"C {min(got[True]):.0f}-{max(got[True]):.0f}")


if __name__ == "__main__":
    main()
