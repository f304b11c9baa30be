"""Ingest A/B in one process: main 846da7f's index (bench/index_v4.py, dict tables) vs this tree's (U64Map tables on
the C path), on bench/index_bench.py's ingest stream (16 workers, caches full); alternating rounds, each on a fresh
index warmed to full caches, gc off, CPU ns per block event, median (min-max).

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/ingest_ab.py [rounds]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import index_v4, synth
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import decode_batch, encode_batch

MODES = ("decode+apply", "apply", "decode")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    warm = synth.event_batches(16, 2000, capacity=4000, seed=3)
    batches = synth.event_batches(16, 4000, capacity=4000, seed=4)
    frames = [(w, encode_batch(b)) for w, b in batches]
    n = synth.block_events(batches)
    impls: list[tuple[str, Any]] = [("main4", index_v4.PrefixIndex), ("new", PrefixIndex)]

    def run(cls: Any, mode: str) -> float:
        index = cls()
        for w, b in warm:
            index.apply(w, b)
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        if mode == "decode+apply":
            for w, f in frames:
                index.apply(w, decode_batch(f))
        elif mode == "apply":
            for w, b in batches:
                index.apply(w, b)
        else:
            for _w, f in frames:
                decode_batch(f)
        dt = time.process_time() - t0
        gc.enable()
        return dt / n * 1e9

    res: dict[tuple[str, str], list[float]] = {(k, m): [] for k, _ in impls for m in MODES}
    for r in range(rounds):
        for m in MODES:
            for name, cls in impls if r % 2 else impls[::-1]:
                res[(name, m)].append(run(cls, m))
    print(f"{n} block events, {rounds} alternating rounds, CPU ns per block event, median (min-max):")
    for m in MODES:
        a, b = (statistics.median(res[(k, m)]) for k in ("main4", "new"))
        spans = {k: f"({min(res[(k, m)]):.0f}-{max(res[(k, m)]):.0f})" for k in ("main4", "new")}
        print(f"{m:<13} main4 {a:6.0f} {spans['main4']}  new {b:6.0f} {spans['new']}  main4/new {a / b:.2f}x  "
              f"new {1e3 / b:.2f} M/s  main4 {1e3 / a:.2f} M/s")


if __name__ == "__main__":
    main()
