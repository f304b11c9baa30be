"""Router overhead: what infera adds on top of a direct connection to the engines.

Two mock engines at a huge speedup (engine time is negligible) serve ~1k-token chat
requests (16 shared system prompts + history, a unique user turn each, small max_tokens).
Side by side in one run, on fresh engines each time, the scenarios are:

  direct      the client talks to one engine (the floor the brief asks for)
  direct-2    the client spreads over both engines itself (the floor at concurrency 32,
              where one single-process mock engine saturates before the router does)
  rr          one infera frontend, --router-policy round-robin
  kv          one infera frontend, --router-policy kv-aware
  kv-x2       two kv-aware frontends over the same engines, clients alternating between them
  rr-p2/kv-p2 one frontend with --workers 2 (two serving processes on one port, SO_REUSEPORT);
              router CPU = the supervisor's and both processes'
  sgl-rr/-ca  sglang-router (PyPI, its own venv) round_robin / cache_aware   (bench/peers.py)
  vllm-rr/-ca vllm-router (PyPI, its own venv) round_robin / cache_aware

For each: p50/p99 latency (non-stream: last byte; stream: first chunk and last byte) at
concurrency 1 and 32, requests/s at 32 (the max of a closed loop on this box), and the
frontend processes' CPU per request, from /proc/<pid>/stat utime+stime over each cell.
The load generator (aiohttp on uvloop) is this process, separate from the frontends.
Scenario order rotates every round; figures are medians over rounds. Then the in-process
kv-aware routing path is timed stage by stage (bench/routing_cpu.py).

    .venv/bin/python bench/router_overhead.py --quick   # ~2 minutes, 1 round
    .venv/bin/python bench/router_overhead.py           # 3 rounds, more requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers
from bench.common import (
    PLOTS,
    Proc,
    chat_body,
    default_tokenizer_dir,
    export_ref,
    frontend,
    frontend_ready,
    http_get,
    machine_info,
    make_session,
    median,
    mock_engine,
    percentile,
    run_load,
    stop_all,
    write_results,
)

MODEL = "bench-model"
SCENARIOS = ("direct", "direct-2", "rr", "kv", "kv-x2", "rr-p2", "kv-p2", "sgl-rr", "sgl-ca", "vllm-rr", "vllm-ca")
FLOORS = ("direct", "direct-2")
# scenario -> (router: infera or a peer package, policy, number of router processes)
FRONTENDS: dict[str, tuple[str, str | None, int]] = {
    "direct": ("", None, 0), "direct-2": ("", None, 0), "rr": ("infera", "round-robin", 1),
    "kv": ("infera", "kv-aware", 1), "kv-x2": ("infera", "kv-aware", 2),
    "rr-p2": ("infera", "round-robin", 1), "kv-p2": ("infera", "kv-aware", 1),
    "sgl-rr": ("sglang-router", "round_robin", 1), "sgl-ca": ("sglang-router", "cache_aware", 1),
    "vllm-rr": ("vllm-router", "round_robin", 1), "vllm-ca": ("vllm-router", "cache_aware", 1)}
PROCESSES = {"rr-p2": 2, "kv-p2": 2}  # scenario -> --workers of its one frontend
CELLS = [(False, 1), (True, 1), (False, 32), (True, 32)]  # (stream, concurrency)
METRIC_PREFIXES = ("infera_routing_decisions", "infera_kv_event_batches", "infera_kv_event_gaps",
                   "infera_kv_indexed_blocks", "infera_kv_events_stale", "infera_routed_prompt_overlap_fraction_sum",
                   "infera_routed_prompt_overlap_fraction_count", "infera_request_retries", "infera_requests_total")


def _cell_name(stream: bool, conc: int) -> str:
    return f"{'stream' if stream else 'non-stream'} c={conc}"


async def _measure_scenario(name: str, engines: list[Proc], fronts: list[Proc], args: argparse.Namespace,
                            bodies: dict[bool, list[bytes]], offset: int) -> dict[str, Any]:
    import aiohttp  # noqa: F401 (fail early if missing)

    path = "/v1/chat/completions"
    if name == "direct":
        urls = [engines[0].url + path]
    elif name == "direct-2":
        urls = [e.url + path for e in engines]
    else:
        urls = [f.url + path for f in fronts]
    out: dict[str, Any] = {"scenario": name, "cells": []}
    async with make_session(64) as session:
        # Warm up: connections, caches, first-call paths.
        for stream in (False, True):
            res = await run_load(session, urls, bodies[stream], 8, args.warmup, 60.0, offset=offset)
            if res.errors:
                raise RuntimeError(f"{name}: warm-up errors ({res.errors}): {res.first_error}")
        for stream, conc in CELLS:
            n = args.n1 if conc == 1 else args.n32
            f0 = [_tree_cpu(f) for f in fronts]
            e0 = [e.cpu() for e in engines]
            s0 = time.process_time()
            res = await run_load(session, urls, bodies[stream], conc, n, args.cell_time_limit, offset=offset + 1000)
            s1 = time.process_time()
            front_cpu = sum(_tree_cpu(f) - c for f, c in zip(fronts, f0, strict=True))
            engine_cpu = sum(e.cpu() - c for e, c in zip(engines, e0, strict=True))
            ok = max(res.ok, 1)
            out["cells"].append({
                "stream": stream, "concurrency": conc, "ok": res.ok, "errors": res.errors,
                "first_error": res.first_error, "elapsed_s": res.elapsed, "rps": res.rps,
                "p50_ms": percentile(res.latencies, 50) * 1e3, "p99_ms": percentile(res.latencies, 99) * 1e3,
                "ttft_p50_ms": percentile(res.ttfts, 50) * 1e3, "ttft_p99_ms": percentile(res.ttfts, 99) * 1e3,
                "router_cpu_s": front_cpu, "router_cpu_us_per_req": front_cpu / ok * 1e6 if fronts else 0.0,
                "engine_cpu_us_per_req": engine_cpu / ok * 1e6, "loadgen_cpu_us_per_req": (s1 - s0) / ok * 1e6,
            })
    return out


def _tree_pids(proc: Proc) -> list[int]:
    """``proc``'s pid and its live children's (a --workers supervisor's serving processes)."""
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        children = []
    return [proc.pid, *(int(c) for c in children)]


def _tree_cpu(proc: Proc) -> float:
    """CPU seconds of ``proc`` and its live children."""
    total = proc.cpu()
    for pid in _tree_pids(proc)[1:]:
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _scrape(front: Proc) -> list[str]:
    status, body = http_get(front.url + "/metrics", timeout=5)
    if status != 200:
        return []
    return [ln for ln in body.decode(errors="replace").splitlines() if ln.startswith(METRIC_PREFIXES)]


def _start_fronts(name: str, engines: list[Proc], tok: Path, log_dir: Path, peer_set: dict[str, Any],
                  root: Path | None = None) -> list[Proc]:
    kind, policy, n_fronts = FRONTENDS[name]
    if policy is None:
        return []
    if kind == "infera" and name in PROCESSES:
        fronts = [frontend("frontend-0", tok, policy, engines, log_dir, root, ("--workers", str(PROCESSES[name])))]
    elif kind == "infera":
        fronts = [frontend(f"frontend-{i}", tok, policy, engines, log_dir, root) for i in range(n_fronts)]
    else:
        fronts = [peers.router(peer_set[kind], policy, [e.url for e in engines], log_dir, tok)]
    for f in fronts:
        f.start()
    for f in fronts:
        if kind == "infera":
            f.wait_ready("/health", 90, frontend_ready(len(engines)))
        else:
            peers.wait_ready(f, len(engines))
    return fronts


def run_scenario(name: str, r: int, args: argparse.Namespace, tok: Path, log_dir: Path,
                 bodies: dict[bool, list[bytes]], peer_set: dict[str, Any] | None = None) -> dict[str, Any]:
    extra = ["--num-kv-blocks", str(args.num_kv_blocks)]
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir / f"r{r}-{name}", args.speedup, extra)
               for i in range(args.engines)]
    fronts: list[Proc] = []
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        fronts = _start_fronts(name, engines, tok, log_dir / f"r{r}-{name}", peer_set or {},
                               getattr(args, "root", None))
        t0 = time.monotonic()
        result = asyncio.run(_measure_scenario(name, engines, fronts, args, bodies, offset=r * 7919))
        result["round"] = r
        result["wall_s"] = time.monotonic() - t0
        result["router_pids"] = [f.pid for f in fronts]
        result["router_metrics"] = [_scrape(f) for f in fronts] if FRONTENDS[name][0] == "infera" else []
        result["router_rss_mb"] = [_rss_mb(pid) for f in fronts for pid in _tree_pids(f)]
        return result
    finally:
        stop_all([*fronts, *engines])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------------------------------
# Summary, table, plot


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over rounds per (scenario, cell); added latency against both direct floors."""
    cells: dict[str, dict[str, dict[str, float]]] = {}
    for name in SCENARIOS:
        sel = [x for x in runs if x["scenario"] == name]
        if not sel:
            continue
        cells[name] = {}
        for stream, conc in CELLS:
            rows = [c for x in sel for c in x["cells"] if c["stream"] == stream and c["concurrency"] == conc]
            agg = {k: median([c[k] for c in rows]) for k in ("p50_ms", "p99_ms", "ttft_p50_ms", "ttft_p99_ms",
                                                             "rps", "router_cpu_us_per_req",
                                                             "engine_cpu_us_per_req", "loadgen_cpu_us_per_req")}
            agg["errors"] = sum(c["errors"] for c in rows)
            agg["ok"] = sum(c["ok"] for c in rows)
            # Whole-scenario CPU: all cells' CPU over all their requests (least tick quantisation).
            cells[name][_cell_name(stream, conc)] = agg
        total_cpu = sum(c["router_cpu_s"] for x in sel for c in x["cells"])
        total_ok = sum(c["ok"] for x in sel for c in x["cells"])
        cells[name]["all"] = {"router_cpu_us_per_req": total_cpu / max(total_ok, 1) * 1e6, "ok": total_ok}
    for by_cell in cells.values():
        for cell, agg in by_cell.items():
            if cell == "all":
                continue
            for floor in ("direct", "direct-2"):
                base = cells.get(floor, {}).get(cell)
                if base is None:
                    continue
                suffix = "" if floor == "direct" else "_vs_direct2"
                agg[f"added_p50_ms{suffix}"] = agg["p50_ms"] - base["p50_ms"]
                agg[f"added_p99_ms{suffix}"] = agg["p99_ms"] - base["p99_ms"]
                agg[f"added_ttft_p50_ms{suffix}"] = agg["ttft_p50_ms"] - base["ttft_p50_ms"]
                agg[f"p50_ratio{suffix}"] = agg["p50_ms"] / base["p50_ms"]
                agg[f"rps_ratio{suffix}"] = agg["rps"] / base["rps"]
    return cells


def print_table(summary: dict[str, Any]) -> None:
    head = (f"{'scenario':<9}{'cell':<16}{'p50 ms':>8}{'p99 ms':>8}{'+p50 ms':>9}{'+p99 ms':>9}{'p50 ×':>7}"
            f"{'TTFT p50':>9}{'+TTFT':>7}{'req/s':>7}{'rps ×':>7}{'+p50 vs d2':>11}{'rps × d2':>9}"
            f"{'router µs/req':>14}{'engine µs/req':>14}")
    print(head)
    print("-" * len(head))
    for name, by_cell in summary.items():
        for stream, conc in CELLS:
            a = by_cell[_cell_name(stream, conc)]
            cpu = f"{a['router_cpu_us_per_req']:.0f}" if name not in FLOORS else "-"
            print(f"{name:<9}{_cell_name(stream, conc):<16}{a['p50_ms']:>8.2f}{a['p99_ms']:>8.2f}"
                  f"{a.get('added_p50_ms', 0):>9.2f}{a.get('added_p99_ms', 0):>9.2f}{a.get('p50_ratio', 1):>7.2f}"
                  f"{a['ttft_p50_ms']:>9.2f}{a.get('added_ttft_p50_ms', 0):>7.2f}{a['rps']:>7.0f}"
                  f"{a.get('rps_ratio', 1):>7.2f}{a.get('added_p50_ms_vs_direct2', 0):>11.2f}"
                  f"{a.get('rps_ratio_vs_direct2', 1):>9.2f}{cpu:>14}{a['engine_cpu_us_per_req']:>14.0f}"
                  + (f"  ERRORS {a['errors']}" if a["errors"] else ""))
        if name not in FLOORS:
            print(f"{'':<9}{'all cells':<16}{'':>99}{by_cell['all']['router_cpu_us_per_req']:>14.0f}")


def plot(summary: dict[str, Any], routing: dict[str, Any] | None, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routed = [n for n in SCENARIOS if n in summary and n not in FLOORS]
    floor = "direct-2" if "direct-2" in summary else "direct"
    key = "added_p50_ms_vs_direct2" if floor == "direct-2" else "added_p50_ms"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6), dpi=80, gridspec_kw={"width_ratios": [2.2, 1.3]})
    width = 0.8 / len(routed)
    if floor not in summary:  # no client-straight-to-engine run: no added latency to draw
        routed_with_floor: list[str] = []
        ax1.text(0.5, 0.5, "no direct floor in this run", ha="center", va="center", transform=ax1.transAxes)
    else:
        routed_with_floor = routed
    for k, name in enumerate(routed_with_floor):
        vals = [summary[name][_cell_name(s, c)][key] for s, c in CELLS]
        xs = [i + (k - (len(routed) - 1) / 2) * width for i in range(len(CELLS))]
        ax1.bar(xs, vals, width, label=name)
    ax1.axhline(0.4, color="red", lw=0.8, ls="--", label="0.4 ms target (rr)")
    ax1.set_yscale("symlog", linthresh=1)
    ax1.set_xticks(range(len(CELLS)), [_cell_name(s, c) for s, c in CELLS], fontsize=8)
    ax1.set_ylabel(f"added p50 vs {floor} (ms)", fontsize=8)
    ax1.legend(fontsize=7)
    ax1.set_title(f"added latency (client straight to the same engines = {floor})", fontsize=9)
    names = list(routed)
    cpu = [summary[n]["all"]["router_cpu_us_per_req"] for n in routed]
    colors = [f"C{k}" for k in range(len(routed))]
    if routing is not None:
        names.append("kv path\nin-process")
        cpu.append(routing["budget_sum_us"])
        colors.append("C7")
    ax2.bar(names, cpu, color=colors)
    ax2.tick_params(axis="x", labelrotation=45)
    ax2.axhline(500, color="red", lw=0.8, ls="--", label="500 µs target (kv routing path)")
    ax2.set_ylabel("CPU µs / request", fontsize=8)
    ax2.tick_params(axis="x", labelsize=7)
    ax2.legend(fontsize=7)
    ax2.set_title("frontend CPU per request", fontsize=9)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _plot_title(info: dict[str, Any], args: dict[str, Any]) -> str:
    return (f"infera router overhead: {info['nproc']} cores {info['cpu']}, {info['date']}, {args['engines']} mock "
            f"engines x{float(args['speedup']):g}, ~1k-token chat, max_tokens {args['max_tokens']}, "
            f"{args['rounds']} round(s)")


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round, fewer requests (~2 minutes)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--n1", type=int, help="measured requests per cell at concurrency 1")
    ap.add_argument("--n32", type=int, help="measured requests per cell at concurrency 32")
    ap.add_argument("--warmup", type=int, default=100, help="warm-up requests per mode and scenario")
    ap.add_argument("--cell-time-limit", type=float, default=60.0, help="seconds; a cell stops early after it")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--speedup", type=float, default=100000.0)
    ap.add_argument("--num-kv-blocks", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset of " + ",".join(SCENARIOS))
    ap.add_argument("--tokenizer", type=Path, default=None, help="tokenizer dir (default .cache/qwen-tokenizer)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--plot-name", default="router_overhead.png", help="file name under bench/plots/")
    ap.add_argument("--skip-routing-cpu", action="store_true", help="skip the in-process stage breakdown")
    ap.add_argument("--no-install", action="store_true", help="do not pip-install missing peers; skip them")
    ap.add_argument("--replot", type=Path, help="redraw the plot and table from a results JSON, then exit")
    ap.add_argument("--ref", default="", help="run infera's frontends from this git ref (exported with its own C "
                    "build; engines and peers as always): a live A/B is this tree's run and the ref's, in turn")
    args = ap.parse_args(argv)
    if args.replot:
        saved = json.loads(args.replot.read_text())
        print_table(saved["summary"])
        plot(saved["summary"], saved.get("routing_cpu"), PLOTS / args.plot_name,
             _plot_title(saved["machine"], saved["args"]))
        return None
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.n1 = args.n1 or (150 if args.quick else 400)
    args.n32 = args.n32 or (800 if args.quick else 2500)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios {sorted(unknown)}")
    peer_set = peers.ensure_all(install=not args.no_install)
    skipped = {s: peer_set[FRONTENDS[s][0]].error for s in scenarios
               if FRONTENDS[s][0] in peer_set and not peer_set[FRONTENDS[s][0]].ok}
    for s, why in skipped.items():
        print(f"skipping {s}: {why}", file=sys.stderr)
    scenarios = [s for s in scenarios if s not in skipped]
    tok = args.tokenizer or default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-overhead-"))
    args.root = export_ref(args.ref, log_dir / "ref") if args.ref else None
    bodies = {s: [chat_body(i, MODEL, s, args.max_tokens) for i in range(4096)] for s in (False, True)}
    info = machine_info()
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = scenarios[r % len(scenarios):] + scenarios[: r % len(scenarios)]
        for name in order:
            t0 = time.monotonic()
            runs.append(run_scenario(name, r, args, tok, log_dir, bodies, peer_set))
            print(f"round {r + 1}/{args.rounds} {name}: {time.monotonic() - t0:.0f}s", file=sys.stderr)
    summary = summarize(runs)
    print(f"\n{info['date']}  nproc={info['nproc']}  cpu={info['cpu']}  python={info['python']}  "
          f"rounds={args.rounds}  n1={args.n1} n32={args.n32}  max_tokens={args.max_tokens}  tokenizer={tok}")
    print_table(summary)
    routing: dict[str, Any] | None = None
    if not args.skip_routing_cpu:
        from bench import routing_cpu

        routing = routing_cpu.run(tok, quick=args.quick)
        print()
        routing_cpu.print_report(routing)
    cmd = " ".join(["bench/router_overhead.py", *(sys.argv[1:] if argv is None else argv)])
    out = {"machine": info, "command": cmd,
           "args": {k: str(v) for k, v in vars(args).items()}, "log_dir": str(log_dir),
           "wall_s": time.monotonic() - started, "peers": {k: vars(v) for k, v in peer_set.items()},
           "skipped": skipped, "summary": summary, "routing_cpu": routing, "runs": runs}
    path = write_results("router_overhead", out)
    print(f"\nresults: {path}")
    if not args.no_plot and {"rr", "kv"} <= set(summary):
        png = PLOTS / args.plot_name
        plot(summary, routing, png, _plot_title(info, out["args"]))
        print(f"plot: {png}")
    for x in runs:
        for i, lines in enumerate(x["router_metrics"]):
            if lines:
                print(f"[{x['scenario']} r{x['round']} frontend-{i}] " + "; ".join(
                    ln for ln in lines if not ln.startswith("infera_requests_total")), file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
