"""``python -m infera.sim``: replay a trace or a workload over N simulated engines, once per policy.

    python -m infera.sim --trace ../shared/data/mooncake/conversation_trace.jsonl --workers 16 \\
        --kv-blocks 1024 --block-size 64 --scale 8 --policies round-robin,kv-aware

prints one Markdown table per workload (policies side by side), writes the JSON to
``--out-dir`` (bench/results) and a plot to ``--plot-dir`` (bench/plots).
"""

from __future__ import annotations

import cProfile
import dataclasses
import pstats
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infera.config.base import load
from infera.config.sim import SimSettings
from infera.engine.mock.timing import StepTimeModel
from infera.router.policies import POLICIES
from infera.sim import report, workloads
from infera.sim.engine import EngineConfig
from infera.sim.fleet import FleetConfig, Simulation
from infera.sim.metrics import limits, summarize
from infera.sim.trace import load_mooncake
from infera.sim.workload import Workload


def policy_names(settings: SimSettings) -> list[str]:
    """``--policies a,b`` and ``--policies a --policies b`` alike."""
    names = [n for item in settings.policies for n in item.split(",") if n]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
    return names


def run_workload(w: Workload, args: SimSettings, engine: EngineConfig) -> dict[str, Any]:
    rows = []
    for i, policy in enumerate(policy_names(args)):
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


def main(argv: Sequence[str] | None = None) -> None:
    args = load(SimSettings, argv, prog="python -m infera.sim", description=__doc__.split("\n\n")[0])
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
    if args.plot:
        stem = args.name or f"sim-{'-'.join(d['name'] for d in docs)}-{args.workers}w"
        report.plot(docs, Path(args.plot_dir) / f"{stem}.png")


if __name__ == "__main__":
    main()
