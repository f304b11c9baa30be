"""Every benchmark of issue 4 in one run: tables on stdout, plots in bench/plots/, sections in bench/README.md.

  1. peers + overhead   bench/router_overhead.py: direct, infera rr/kv/kv-x2, sglang-router and
                        vllm-router (round_robin, cache_aware), installed from PyPI into .cache/peers/
  2. routing quality    bench/routing_quality.py: workloads (a) tenants, (b) multi-turn, (c) unique
  3. index, tokenizer   bench/index_bench.py
  4. scale              bench/scale.py: decision cost up to 1024 workers
  5. targets            bench/targets.py: each target of the issue beside its figure

    scripts/bench            # everything (~35 minutes on 2 cores)
    scripts/bench --quick    # a few minutes, fewer requests, 1 round
    .venv/bin/python bench/run_all.py --readme-from bench/results/run_all-<stamp>.json   # rewrite the README only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report, targets
from bench.common import PLOTS, REPO, machine_info, write_results

STEPS = ("overhead", "quality", "index", "scale")


def plot_index_scale(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.3), dpi=80)
    ix, sc = run.get("index"), run.get("scale")
    if ix:
        for impl, spread, ls in (("new", "few", "-"), ("new", "all", "--"), ("old", "all", ":")):
            for size in sorted({r["prompt_tokens"] for r in ix["query"]}):
                rows = [r for r in ix["query"] if r["spread"] == spread and r["prompt_tokens"] == size
                        and r.get("impl", "new") == impl]
                if rows:
                    ax1.plot([r["workers"] for r in rows], [r.get("cpu_p99_us", r["p99_us"]) / 1000 for r in rows],
                             ls, marker="o", label=f"{impl} {spread}, {size // 1024}k tok")
        ax1.axhline(1.0, color="red", lw=0.8, ls=":", label="1 ms target")
        ax1.set(xscale="log", yscale="log", xlabel="workers", ylabel="overlap query p99 (ms, CPU if measured)")
        ax1.legend(fontsize=6, ncol=2)
        ax1.set_title("PrefixIndex.overlaps p99", fontsize=9)
    if sc:
        xs = [r["workers"] for r in sc["rows"]]
        for key, label in (("kv-aware_decision_us", "kv decision"), ("kv-aware_pick_us", "kv pick only"),
                           ("round-robin_decision_us", "rr decision")):
            ax2.plot(xs, [r[key] for r in sc["rows"]], marker="o", label=label)
        ax2.set(xscale="log", yscale="log", xlabel="workers", ylabel="CPU µs / decision")
        ax2.legend(fontsize=7)
        ax2.set_title("routing decision cost vs fleet size", fontsize=9)
    fig.suptitle(f"infera index and scale, {run['machine']['date']}, nproc={run['machine']['nproc']}", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def update_readme(run: dict[str, Any]) -> None:
    sections = {"Peers": report.peers_section(run), "Routing quality": report.quality_section(run),
                "Index and tokenizer": report.index_section(run), "Scale": report.scale_section(run),
                "Targets": targets.section(run)}
    sections = {k: v for k, v in sections.items() if not v.startswith("Not run")}
    report.write_readme(REPO / "bench" / "README.md", sections)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few minutes: 1 round, fewer requests")
    ap.add_argument("--skip", default="", help="comma-separated steps to skip: " + ",".join(STEPS))
    ap.add_argument("--no-install", action="store_true", help="do not pip-install missing peers; skip them")
    ap.add_argument("--no-readme", action="store_true", help="do not touch bench/README.md")
    ap.add_argument("--readme-from", type=Path, help="rewrite the README and plots from a saved run; exit")
    args = ap.parse_args()
    if args.readme_from:
        run = json.loads(args.readme_from.read_text())
        plot_index_scale(run, PLOTS / "index_scale.png")
        update_readme(run)
        targets.print_targets(run)
        return
    skip = {s for s in args.skip.split(",") if s}
    quick = ["--quick"] if args.quick else []
    inst = ["--no-install"] if args.no_install else []
    cmd = "scripts/bench" + (" --quick" if args.quick else "") + "".join(f" {a}" for a in sys.argv[1:]
                                                                          if a != "--quick")
    run: dict[str, Any] = {"command": cmd, "machine": machine_info(), "quick": args.quick}
    started = time.monotonic()
    if "overhead" not in skip:
        from bench import router_overhead

        print("== 1. peers and overhead", flush=True)
        extra = [] if args.quick else ["--rounds", "2", "--n1", "300", "--n32", "1500"]
        run["overhead"] = router_overhead.main([*quick, *extra, *inst, "--skip-routing-cpu",
                                                "--plot-name", "router_overhead_peers.png"])
        run["peers"] = run["overhead"]["peers"] if run["overhead"] else {}
    if "quality" not in skip:
        from bench import routing_quality

        print("\n== 2. routing quality", flush=True)
        routers = [] if args.quick else ["--routers", "round-robin,infera kv-aware,sglang cache_aware,"
                                         "vllm cache_aware,infera kv w=4"]
        run["quality"] = routing_quality.main([*quick, *routers, *inst])
        run.setdefault("peers", run["quality"]["peers"])
    if "index" not in skip:
        from bench import index_bench

        print("\n== 3. index and tokenizer", flush=True)
        run["index"] = index_bench.main(quick)
    if "scale" not in skip:
        from bench import scale

        print("\n== 4. scale", flush=True)
        run["scale"] = scale.main(quick)
    run["wall_s"] = time.monotonic() - started
    for key in ("overhead", "quality"):  # the full per-request data stays in their own results files
        if run.get(key):
            run[key] = {k: v for k, v in run[key].items() if k not in ("runs",)}
    path = write_results("run_all", run)
    plot_index_scale(run, PLOTS / "index_scale.png")
    print(f"\n== 5. targets ({run['wall_s'] / 60:.0f} min in all)")
    targets.print_targets(run)
    if not args.no_readme:
        update_readme(run)
        print(f"\nbench/README.md updated; results {path}")


if __name__ == "__main__":
    main()
