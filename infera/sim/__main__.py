"""``python -m infera.sim``: replay a trace or a workload over N simulated engines, once per policy.

    python -m infera.sim --trace ../shared/data/mooncake/conversation_trace.jsonl --workers 16 \\
        --kv-blocks 1024 --block-size 64 --scale 8 --policies round-robin,kv-aware

prints one Markdown table per workload (policies side by side), writes the JSON to
``--out-dir`` (bench/results) and a plot to ``--plot-dir`` (bench/plots).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import sys
import time
from pathlib import Path
from typing import Any

from infera.engine.mock.timing import StepTimeModel
from infera.router.policies import POLICIES
from infera.sim import report, workloads
from infera.sim.engine import EngineConfig
from infera.sim.fleet import DEFAULT_EVENT_DELAY, FleetConfig, Simulation
from infera.sim.metrics import limits, summarize
from infera.sim.trace import load_mooncake
from infera.sim.workload import Workload

DEFAULT_POLICIES = "round-robin,least-load,kv-aware,approx-prefix"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m infera.sim", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="a Mooncake-format JSONL trace")
    src.add_argument("--workload", help=f"comma-separated: {','.join(workloads.BUILDERS)} (or 'all')")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated, of: {', '.join(POLICIES)}")
    p.add_argument("--kv-blocks", type=int, default=2048, help="KV blocks per engine")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--speedup-ratio", type=float, default=1.0, help="divide every modelled step time by this")
    p.add_argument("--scale", type=int, default=8, help="trace: divide lengths and the 512-token block by this")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace: multiply arrival times by this")
    p.add_argument("--limit", type=int, default=0, help="trace: first N requests only (0 = all)")
    p.add_argument("--quick", action="store_true", help="workloads: the smaller sizes")
    p.add_argument("--kv-overlap-weight", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--event-delay", type=float, default=DEFAULT_EVENT_DELAY,
                   help="seconds between an engine publishing KV events and the router applying them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="", help="results file stem (default: from the input)")
    p.add_argument("--out-dir", default="bench/results")
    p.add_argument("--plot-dir", default="bench/plots")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--profile", action="store_true", help="cProfile the first policy's run; print the top")
    return p.parse_args(argv)


def run_workload(w: Workload, args: argparse.Namespace, engine: EngineConfig) -> dict[str, Any]:
    rows = []
    for i, policy in enumerate(p for p in args.policies.split(",") if p):
        if policy not in POLICIES:
            raise SystemExit(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
        cfg = FleetConfig(workers=args.workers, engine=engine, policy=policy, kv_overlap_weight=args.kv_overlap_weight,
                          temperature=args.temperature, event_delay=args.event_delay, seed=args.seed)
        t0, c0 = time.perf_counter(), time.process_time()
        sim = Simulation(w, cfg)
        if args.profile and i == 0:
            prof = cProfile.Profile()
            result = prof.runcall(sim.run)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
        else:
            result = sim.run()
        row = summarize(result)
        row["wall_seconds"] = time.perf_counter() - t0
        row["cpu_seconds"] = time.process_time() - c0  # the box is shared: CPU time is the fair speed figure
        rows.append(row)
        print(f"  {w.name} {policy}: {row['wall_seconds']:.1f}s wall, {row['cpu_seconds']:.1f}s CPU, "
              f"TTFT p90 {row['ttft_p90'] * 1000:.0f} ms, hit {row['hit_ratio']:.3f}", file=sys.stderr)
    usable = (engine.num_blocks - 1) * args.workers
    return {
        "name": w.name, "label": w.label, "params": w.params, "workers": args.workers,
        "requests": w.n_requests, "engine": {**dataclasses.asdict(engine), "timing": dataclasses.asdict(engine.timing)},
        "event_delay": args.event_delay, "seed": args.seed,
        "limits": limits(w, engine.block_size, usable), "policies": rows,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    engine = EngineConfig(num_blocks=args.kv_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          timing=StepTimeModel(speedup_ratio=args.speedup_ratio))
    if args.trace:
        loaded = [load_mooncake(args.trace, args.scale, args.time_scale, args.limit, args.seed)]
    else:
        names = list(workloads.BUILDERS) if args.workload == "all" else args.workload.split(",")
        loaded = [workloads.build(n, args.quick, args.seed) for n in names]
    docs = []
    for w in loaded:
        doc = run_workload(w, args, engine)
        docs.append(doc)
        print(report.table(doc) + "\n")
        stem = f"sim-{w.name}-{args.workers}w" if not args.name else (
            args.name if len(loaded) == 1 else f"{args.name}-{w.name}")
        report.write_json(doc, Path(args.out_dir) / f"{stem}.json")
    if not args.no_plot:
        stem = args.name or f"sim-{'-'.join(d['name'] for d in docs)}-{args.workers}w"
        report.plot(docs, Path(args.plot_dir) / f"{stem}.png")


if __name__ == "__main__":
    main()
