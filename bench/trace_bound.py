"""How low can any placement push TTFT on a Mooncake trace? Bounds from each request's own prefill (issue 14).

Reads the trace's ``hash_ids`` directly (one id = one 512-token block at ``--scale 1``; ids chain, so two
requests share the first k blocks iff their first k ids are equal; the last, partial block is never cached,
as the simulator's engines) and gives each request's TTFT alone on an idle engine (its uncached tokens'
prefill steps of at most 8,192 tokens, the mock's timing, no queue, no decode batch sharing its steps) for:

- ``no-cache``: the whole prompt (what a request pays when nothing it needs is cached);
- ``infinite``: the uncached part under an unbounded cache holding every block any earlier request had (no
  placement, no memory size, can save more: the floor);
- ``capacity``: the uncached part under one LRU as large as the fleet's KV memory (``--workers`` x
  ``--kv-blocks`` - 1 usable blocks each, the simulator's capacity limit): what a perfect router could keep
  if the fleet's memory were one pool.

Each is a lower bound on the TTFT a placement could give (every real TTFT also waits for the step in
progress and shares its steps); quoted against round-robin's simulated p90 (``--rr-p90``, ms, from
``bench/cost_sweep.py --trace``), the ratio is the best any placement could do.

    .venv/bin/python bench/trace_bound.py --trace $T --workers 64 --kv-blocks 1024 --rr-p90 747
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infera.engine.mock.timing import StepTimeModel
from infera.sim.metrics import percentile

TRACE_BLOCK = 512
STEP_TOKENS = 8192


def alone_ms(tokens: int, timing: StepTimeModel) -> float:
    """Prefill of ``tokens`` uncached tokens alone on an idle engine, in chunks of one step's budget."""
    ms = 0.0
    while tokens > 0:
        step = min(tokens, STEP_TOKENS)
        ms += timing.prefill_ms(step)
        tokens -= step
    return ms / timing.speedup_ratio


def floor_ms(tokens: int, timing: StepTimeModel) -> float:
    """The least time any split of ``tokens`` into steps of at most 8,192 can take, each step computing nothing
    else (the cost is convex, so for k steps equal chunks are best; the engine alone takes greedy chunks,
    ``alone_ms``, which is slower when the last chunk is small). A strict floor even for a request whose steps
    are shared: a shared step takes at least as long as its own tokens alone."""
    if tokens <= 0:
        return 0.0
    k0 = -(-tokens // STEP_TOKENS)
    best = min(k * timing.prefill_ms(0) + sum(timing.prefill_ms(tokens // k + (j < tokens % k)) - timing.prefill_ms(0)
                                             for j in range(k))
               for k in range(k0, k0 + 4))
    return best / timing.speedup_ratio


def bounds(path: str | Path, capacity_blocks: int, timing: StepTimeModel | None = None,
           limit: int = 0) -> dict[str, list[float]]:
    """Per request (trace order): its TTFT alone (ms) with no cache, an infinite cache, a fleet-sized LRU;
    and its prompt tokens, for the hit ratios."""
    timing = timing or StepTimeModel()
    seen: set[tuple[int, ...] | int] = set()
    lru: OrderedDict[int, None] = OrderedDict()
    out: dict[str, list[float]] = {"no-cache": [], "infinite": [], "capacity": [], "infinite-floor": [],
                                   "prompt": [], "hit_infinite": [], "hit_capacity": []}
    chain: dict[tuple[int, int], int] = {}  # (parent key, hash id) -> key of that prefix
    replies = 0  # reply blocks so far (negative keys, one per block: no two replies are equal)
    with open(path) as f:
        for i, line in enumerate(f):
            if limit and i >= limit:
                break
            rec = json.loads(line)
            n_in = int(rec["input_length"])
            ids = [int(h) for h in rec["hash_ids"]]
            full = min(len(ids), n_in // TRACE_BLOCK)  # full blocks only (a partial one is never stored)
            usable = min(full, (n_in - 1) // TRACE_BLOCK)  # the last prompt token is never a hit
            keys, parent = [], -1
            for h in ids[:full]:
                parent = chain.setdefault((parent, h), len(chain))
                keys.append(parent)
            n = 0
            while n < usable and keys[n] in seen:
                n += 1
            m = 0
            while m < usable and keys[m] in lru:
                m += 1
            # the reply's blocks (and a partial prompt block the reply fills) are stored too, never shared
            extra = (n_in + int(rec["output_length"])) // TRACE_BLOCK - full
            keys.extend(range(-1 - replies, -1 - replies - extra, -1))
            replies += extra
            seen.update(keys)
            for k in keys:
                lru[k] = None
                lru.move_to_end(k)
            while len(lru) > capacity_blocks:
                lru.popitem(last=False)
            out["prompt"].append(n_in)
            out["hit_infinite"].append(n * TRACE_BLOCK)
            out["hit_capacity"].append(m * TRACE_BLOCK)
            out["no-cache"].append(alone_ms(n_in, timing))
            out["infinite"].append(alone_ms(n_in - n * TRACE_BLOCK, timing))
            out["capacity"].append(alone_ms(n_in - m * TRACE_BLOCK, timing))
            out["infinite-floor"].append(floor_ms(n_in - n * TRACE_BLOCK, timing))
    return out


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--kv-blocks", type=int, default=1024)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--rr-p90", type=float, default=0.0, help="round-robin's simulated TTFT p90 (ms) to quote against")
    args = ap.parse_args(argv)
    b = bounds(args.trace, args.workers * (args.kv_blocks - 1), limit=args.limit)
    prompt = sum(b["prompt"])
    print(f"{args.trace}: {len(b['prompt'])} requests, {args.workers} workers x {args.kv_blocks} blocks of "
          f"{TRACE_BLOCK}; hit limits infinite {sum(b['hit_infinite']) / prompt:.3f}, capacity "
          f"{sum(b['hit_capacity']) / prompt:.3f}")
    rows = {}
    for k in ("no-cache", "infinite", "capacity", "infinite-floor"):
        v = b[k]
        row = {"p50": percentile(v, 0.5), "p90": percentile(v, 0.9), "p99": percentile(v, 0.99),
               "mean": sum(v) / len(v)}
        rows[k] = row
        ratio = f"  p90 / round-robin's {row['p90'] / args.rr_p90:.2f}" if args.rr_p90 else ""
        print(f"  alone, {k:<14} TTFT p50 {row['p50']:7.1f}  p90 {row['p90']:7.1f}  p99 {row['p99']:7.1f}  "
              f"mean {row['mean']:7.1f} ms{ratio}")
    return rows


if __name__ == "__main__":
    main()
