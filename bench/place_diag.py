"""Why kv-aware leaves a cached prefix: every routing decision of one simulated run, term by term.

Runs ``infera.sim`` on the bench workloads with a kv-aware policy wrapped so that each decision
records, for the chosen worker and the worker with the longest cached prefix (confirmed +
predicted blocks), the cost's terms (``KvTtftPolicy.terms``). For the decisions that left the
longest prefix (reason ``load``) it prints how many there were, the blocks of prefix they gave
up (against the prompt blocks of the run), and which term paid for the move: the term whose
difference (prefix holder minus chosen) is the largest.

    .venv/bin/python bench/place_diag.py --quick --workers 4 --workloads tenants,multiturn
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infera.engine.mock.timing import StepTimeModel
from infera.router.base import Candidate, RoutingContext, Scores
from infera.router.kv_ttft import KvTtftPolicy
from infera.router.policies import POLICIES
from infera.sim import workloads
from infera.sim.engine import EngineConfig
from infera.sim.fleet import FleetConfig, Simulation
from infera.sim.metrics import summarize
from infera.sim.trace import load_mooncake

TERMS = ("prefill", "batch", "memory", "horizon", "eviction", "stall", "occupancy", "duplication")


def diagnosed(base: type[KvTtftPolicy], log: list[dict[str, Any]]) -> type[KvTtftPolicy]:
    seen: set[int] = set()  # every prompt block any earlier decision routed: an infinite cache's view

    class Diagnosed(base):  # type: ignore[valid-type,misc]
        def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
            scores: Scores = super().score(ctx, candidates)
            overlaps = scores.overlap_blocks or [0] * len(candidates)
            hashes = ctx.hashes(candidates[0].worker.kv_block_size)
            ever = next((i for i, h in enumerate(hashes) if h not in seen), len(hashes))
            seen.update(hashes)
            low = min(scores.costs)
            chosen = min((i for i, c in enumerate(scores.costs) if c - low <= 1e-9),
                         key=lambda i: (candidates[i].in_flight, i))
            holder = max(range(len(candidates)), key=lambda i: (overlaps[i], -scores.costs[i]))
            size = candidates[0].worker.kv_block_size
            row: dict[str, Any] = {"reason": scores.reason, "blocks": ctx.prompt_tokens // size,
                                   "lost": overlaps[holder] - overlaps[chosen], "ever": ever,
                                   "best": overlaps[holder], "got": overlaps[chosen],
                                   "holders": sum(1 for o in overlaps if o > 0)}
            if row["lost"] > 0:
                a = self.terms(ctx, candidates[holder], overlaps[holder])
                b = self.terms(ctx, candidates[chosen], overlaps[chosen])
                # split prefill into the queue ahead and the own uncached part
                diff = {t: x - y for t, x, y in zip(TERMS, a, b, strict=True)}
                diff["stay"] = self.stay_added[holder] - self.stay_added[chosen]
                row["diff"] = diff
                row["queued"] = (candidates[holder].prefill_tokens, candidates[chosen].prefill_tokens)
                row["decoding"] = (self._load.decoding(candidates[holder].worker.instance_id),
                                   self._load.decoding(candidates[chosen].worker.instance_id))
            log.append(row)
            return scores
    return Diagnosed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="tenants,multiturn,agentic,burst")
    ap.add_argument("--policy", default="kv-aware")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--kv-blocks", type=int, default=2048)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=0,
                    help="cut every output to this many tokens (the live bench runs 32), as bench/cost_sweep.py")
    ap.add_argument("--seed", type=int, default=0, help="workload seed")
    ap.add_argument("--trace", default="", help="a Mooncake trace instead of the workloads (as bench/cost_sweep.py)")
    ap.add_argument("--scale", type=int, default=8, help="trace: divide lengths and the 512-token block by this")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="trace: first N requests only")
    ap.add_argument("--time-scale", type=float, default=1.0, help="trace: multiply arrival times by this")
    ap.add_argument("--live", action="store_true",
                    help="the live bench's own requests (bench/oracle_ttft.py: its prompts, arrivals and KV blocks"
                         " per engine; --kv-blocks and --quick are then ignored)")
    args = ap.parse_args(argv)
    engine = EngineConfig(num_blocks=args.kv_blocks, block_size=args.block_size, timing=StepTimeModel())
    if args.trace:
        runs = [(load_mooncake(args.trace, args.scale, args.time_scale, args.limit, args.seed), engine)]
    elif args.live:
        from bench.oracle_ttft import live_workloads

        runs = [(w, EngineConfig(num_blocks=b, block_size=16, timing=StepTimeModel()))
                for w, b, _ in live_workloads(args.workloads.split(","), args.max_tokens or 32)]
    else:
        runs = [(workloads.build(name, args.quick, args.seed), engine) for name in args.workloads.split(",")]
    for w, engine in runs:
        name = w.name
        log: list[dict[str, Any]] = []
        POLICIES["diag"] = diagnosed(POLICIES[args.policy], log)  # type: ignore[arg-type]
        if args.max_tokens and not args.live:
            for s in w.sessions:
                for t in s.turns:
                    t.output = t.output[:args.max_tokens]
        row = summarize(Simulation(w, FleetConfig(workers=args.workers, engine=engine, policy="diag")).run())
        moved = [r for r in log if r["lost"] > 0]
        blocks = sum(r["blocks"] for r in log)
        lost = sum(r["lost"] for r in moved)
        why = Counter(max(r["diff"], key=lambda t: r["diff"][t]) for r in moved)
        mean = {t: sum(r["diff"][t] for r in moved) / max(len(moved), 1) for t in (*TERMS, "stay")}
        qh = sum(r["queued"][0] for r in moved) / max(len(moved), 1)
        qc = sum(r["queued"][1] for r in moved) / max(len(moved), 1)
        dh = sum(r["decoding"][0] for r in moved) / max(len(moved), 1)
        dc = sum(r["decoding"][1] for r in moved) / max(len(moved), 1)
        print(f"{name}: {len(log)} decisions, {len(moved)} left the longest prefix, giving up {lost} of {blocks} "
              f"prompt blocks ({lost / max(blocks, 1):.1%}); hit {row['hit_ratio']:.3f}, TTFT p50/p90 "
              f"{row['ttft_p50'] * 1000:.0f}/{row['ttft_p90'] * 1000:.0f} ms")
        print(f"  deciding term (holder minus chosen, largest): {dict(why)}")
        print("  mean difference ms: " + ", ".join(f"{t} {v:+.1f}" for t, v in mean.items()))
        print(f"  mean queued prefill tokens holder/chosen {qh:.0f}/{qc:.0f}, decoding {dh:.1f}/{dc:.1f}")
        ever = sum(r["ever"] for r in log)
        best = sum(r["best"] for r in log)
        got = sum(r["got"] for r in log)
        print(f"  prompt blocks {blocks}: seen before (infinite cache) {ever} ({ever / max(blocks, 1):.1%}), on some"
              f" worker at decision time {best} ({best / max(blocks, 1):.1%}), on the chosen one {got}"
              f" ({got / max(blocks, 1):.1%}); lost to eviction/never cached {ever - best}, to moves {best - got}")
        hold = Counter(min(r["holders"], 9) for r in log if r["ever"] > 0)
        print(f"  workers holding some prefix of a request seen before (9 = 9+): {dict(sorted(hold.items()))}")


if __name__ == "__main__":
    main()
