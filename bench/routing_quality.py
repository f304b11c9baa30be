"""Routing quality: the same realistic workloads through every router, on mock engines with real timing.

N mock engines (``--speedup-ratio`` ~10: Dynamo's mocker step-time constants, divided) whose KV
capacity holds ~70 % of what a workload needs cached at once (bench/workloads.py: ``hot_blocks``), so
a router that spreads every prefix over every engine thrashes while one that partitions fits. Per
workload the engines start once; every router starts in front of them (infera round-robin, infera
kv-aware, sglang-router cache_aware, vllm-router cache_aware); then, in an order rotated per
workload, each router plays the workload after the engines' prefix caches are reset. Reported per
(workload, router): TTFT p50/p90 (first streamed chunk), output tokens/s (usage over the cell's
wall time), prefix-cache hit ratio (the engines' ``vllm:prefix_cache_hits/queries`` counters), that
ratio as a fraction of the infinite-cache limit, and load imbalance: the time-averaged in-flight
(running + waiting, sampled every 0.25 s from each engine's /metrics) of the busiest engine over the
mean (1.0 = even), and the same for requests served.

    .venv/bin/python bench/routing_quality.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers, workloads
from bench.common import (
    PLOTS,
    Proc,
    default_tokenizer_dir,
    frontend,
    frontend_ready,
    http_get,
    machine_info,
    mock_engine,
    percentile,
    stop_all,
    write_results,
)
from bench.quality_load import reset_caches, run_cell, warm_up

MODEL = "bench-model"
# router label -> (infera or a peer package, policy, extra flags)
ROUTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "round-robin": ("infera", "round-robin", ()), "infera kv-aware": ("infera", "kv-aware", ()),
    "sglang cache_aware": ("sglang-router", "cache_aware", ()), "vllm cache_aware": ("vllm-router", "cache_aware", ()),
    "infera kv w=4": ("infera", "kv-aware", ("--kv-overlap-weight", "4")),
    "infera kv-blocks": ("infera", "kv-aware-blocks", ()),
    "infera kv-eviction": ("infera", "kv-aware-eviction", ()),
    "infera kv-occupancy": ("infera", "kv-aware-occupancy", ()),
    "infera kv-busy": ("infera", "kv-aware-busy", ()),
    "infera kv-hold": ("infera", "kv-aware-hold", ()),
    "infera kv-flat": ("infera", "kv-aware-flat", ())}
DEFAULT_ROUTERS = ("round-robin", "infera kv-aware", "sglang cache_aware", "vllm cache_aware")
FIT = 0.7  # share of the hot working set one engine's KV cache holds


def _start_routers(names: list[str], engines: list[Proc], tok: Path, log_dir: Path,
                   peer_set: dict[str, peers.Peer]) -> dict[str, Proc]:
    procs: dict[str, Proc] = {}
    for name in names:
        kind, policy, extra = ROUTERS[name]
        if kind == "infera":
            procs[name] = frontend(f"infera-{policy}-{len(procs)}", tok, policy, engines, log_dir)
            procs[name].argv += extra
        else:
            procs[name] = peers.router(peer_set[kind], policy, [e.url for e in engines], log_dir, tok)
        procs[name].start()
    for name, p in procs.items():
        if ROUTERS[name][0] == "infera":
            p.wait_ready("/health", 90, frontend_ready(len(engines)))
        else:
            peers.wait_ready(p, len(engines))
    return procs


def _infera_urls(routers: dict[str, Proc]) -> list[str]:
    """The infera frontends among ``routers``: each indexes every engine's KV events, whichever cell runs."""
    return [p.url for name, p in routers.items() if ROUTERS[name][0] == "infera"]


def _summarize_cell(cell: dict[str, Any], limit: float) -> dict[str, Any]:
    outs = cell["outcomes"]
    eng = cell["engines"]
    queries = sum(e["queries"] for e in eng)
    hits = sum(e["hits"] for e in eng)
    samples = cell["samples"]
    n_eng = len(eng)
    mean_inflight = [sum(s[k] for s in samples) / max(len(samples), 1) for k in range(n_eng)]
    avg = sum(mean_inflight) / n_eng if n_eng else 0.0
    served = [e["requests"] for e in eng]
    hit = hits / queries if queries else float("nan")
    return {
        "ok": len(outs), "errors": len(cell["errors"]), "first_error": (cell["errors"] or [""])[0][:300],
        "elapsed_s": cell["elapsed"],
        "ttft_p50_ms": percentile([o.ttft for o in outs], 50) * 1e3,
        "ttft_p90_ms": percentile([o.ttft for o in outs], 90) * 1e3,
        "e2e_p50_ms": percentile([o.e2e for o in outs], 50) * 1e3,
        "out_tok_s": sum(o.completion_tokens for o in outs) / cell["elapsed"] if cell["elapsed"] else 0.0,
        "hit_ratio": hit, "hit_of_limit": hit / limit if limit else float("nan"),
        "usage_hit_ratio": sum(o.cached_tokens for o in outs) / max(sum(o.prompt_tokens for o in outs), 1),
        "imbalance_inflight": max(mean_inflight) / avg if avg else float("nan"),
        "imbalance_served": max(served) / (sum(served) / n_eng) if sum(served) else float("nan"),
        "mean_inflight": mean_inflight, "served": served, "samples": len(samples),
        "preemptions": sum(e["preemptions"] for e in eng),
    }


def run_workload(w: workloads.Workload, names: list[str], order_shift: int, args: argparse.Namespace, tok: Path,
                 log_dir: Path, peer_set: dict[str, peers.Peer], renderer: Any,
                 kv_blocks: int | None) -> dict[str, Any]:
    ids = [renderer.chat_token_ids(m) for m in w.messages]
    lim = workloads.hit_limit(w, ids)
    hot = workloads.hot_blocks(w, ids, lim["reused_blocks"])
    blocks = kv_blocks or max(int(FIT * hot), 256)
    print(f"{w.name}: {w.n_requests} requests, mean prompt {lim['mean_prompt_tokens']:.0f} tokens, hit limit "
          f"{lim['limit']:.1%}, hot set {hot} blocks -> {blocks} KV blocks per engine", file=sys.stderr)
    extra = ["--num-kv-blocks", str(blocks), "--max-num-seqs", "256"]
    wdir = log_dir / w.name
    engines = [mock_engine(f"engine-{k}", tok, MODEL, wdir, args.speedup, extra) for k in range(args.engines)]
    routers: dict[str, Proc] = {}
    cells: dict[str, Any] = {}
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        routers = _start_routers(names, engines, tok, wdir, peer_set)
        order = names[order_shift % len(names):] + names[: order_shift % len(names)]
        for name in order:
            failed = asyncio.run(warm_up(routers[name].url, MODEL))
            if failed:
                print(f"  warning: {failed} warm-up requests through {name} failed", file=sys.stderr)
            ok = asyncio.run(_reset([e.url for e in engines], _infera_urls(routers)))
            if not all(ok):
                print(f"  warning: prefix-cache reset refused on some engine ({ok})", file=sys.stderr)
            cpu0 = routers[name].cpu()
            t0 = time.monotonic()
            cell = asyncio.run(run_cell(routers[name].url, w, MODEL, [e.url for e in engines], args.cell_time_limit))
            s = _summarize_cell(cell, lim["limit"])
            s["router_cpu_us_per_req"] = (routers[name].cpu() - cpu0) / max(s["ok"], 1) * 1e6
            if ROUTERS[name][0] == "infera":
                _status, body = http_get(routers[name].url + "/metrics", timeout=5)
                s["infera_metrics"] = [ln for ln in body.decode(errors="replace").splitlines()
                                       if ln.startswith(("infera_routing_decisions", "infera_kv_events_stale",
                                                         "infera_routed_prompt_overlap_fraction_"))]
            cells[name] = s
            print(f"  {name:<20} {time.monotonic() - t0:5.0f}s  ok {s['ok']} err {s['errors']}  TTFT p90 "
                  f"{s['ttft_p90_ms']:.0f} ms  hit {s['hit_ratio']:.1%}  imbalance {s['imbalance_inflight']:.2f}"
                  + (f"  first error: {s['first_error']}" if s["errors"] else ""), file=sys.stderr)
    finally:
        stop_all([*routers.values(), *engines])
    return {"workload": w.name, "label": w.label, "params": w.params, "max_tokens": w.max_tokens, "limit": lim,
            "hot_blocks": hot, "kv_blocks_per_engine": blocks, "cells": cells}


async def _reset(engines: list[str], frontends: list[str], wait_s: float = 30.0) -> list[bool]:
    """Reset the engines' prefix caches and flush the reset out of the next cell: a mock engine (like vLLM)
    publishes AllBlocksCleared with its next step, so a prompt shorter than one block (no block stored) makes
    each engine step, and this waits until every infera frontend in ``frontends`` (all subscribe to every
    engine) indexes 0 blocks for each engine (its ``infera_kv_indexed_blocks`` gauges). Else each cell opened
    with the frontends' clears of the index the previous cells filled, charged to its router's CPU column."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        ok = await reset_caches(session, engines)
        await asyncio.gather(*(_step(session, e) for e in engines))
        if all(ok):  # (an engine that refused keeps its blocks; the caller warns)
            await _cleared(session, frontends, len(engines), wait_s)
    return ok


async def _step(session: Any, engine: str) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "temperature": 0}
    async with session.post(engine + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{engine}: the flush request failed: {resp.status} {(await resp.text())[:200]}")
        await resp.read()


async def _cleared(session: Any, frontends: list[str], n_engines: int, wait_s: float) -> None:
    """Wait until each frontend's /metrics shows ``n_engines`` workers, every one with 0 indexed blocks."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + wait_s
    for url in frontends:
        while True:
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            blocks = {s.labels["worker"]: s.value for f in text_string_to_metric_families(text)
                      if f.name == "infera_kv_indexed_blocks" for s in f.samples}
            if len(blocks) >= n_engines and not any(blocks.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} still indexes blocks {wait_s:g} s after the engines' prefix-cache reset "
                                   f"(infera_kv_indexed_blocks: {blocks})")
            await asyncio.sleep(0.02)  # a poll of the condition, bounded by the deadline


# ---------------------------------------------------------------------------------------


def print_table(results: list[dict[str, Any]]) -> None:
    head = (f"{'workload':<11}{'router':<20}{'TTFT p50':>9}{'p90 ms':>8}{'p90/rr':>7}{'out tok/s':>10}{'tok/s/rr':>9}"
            f"{'hit':>7}{'limit':>7}{'of lim':>7}{'imbal':>7}{'served':>7}{'CPU µs/req':>11}{'ok':>6}{'err':>5}")
    print(head)
    print("-" * len(head))
    for r in results:
        base = r["cells"].get("round-robin", {})
        for name, c in r["cells"].items():
            p90 = c["ttft_p90_ms"] / base["ttft_p90_ms"] if base else float("nan")
            tps = c["out_tok_s"] / base["out_tok_s"] if base else float("nan")
            print(f"{r['workload']:<11}{name:<20}{c['ttft_p50_ms']:>9.1f}{c['ttft_p90_ms']:>8.1f}{p90:>7.2f}"
                  f"{c['out_tok_s']:>10.0f}{tps:>9.3f}{c['hit_ratio']:>7.1%}{r['limit']['limit']:>7.1%}"
                  f"{c['hit_of_limit']:>7.1%}{c['imbalance_inflight']:>7.2f}{c['imbalance_served']:>7.2f}"
                  f"{c['router_cpu_us_per_req']:>11.0f}{c['ok']:>6}{c['errors']:>5}")


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("ttft_p90_ms", "TTFT p90 (ms)"), ("hit_of_limit", "hit ratio / limit"),
               ("out_tok_s", "output tokens/s"), ("imbalance_inflight", "imbalance (max/mean in-flight)")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(13, 3.2), dpi=80)
    names = [n for n in ROUTERS if any(n in r["cells"] for r in results)]
    width = 0.8 / len(names)
    for ax, (key, label) in zip(axes, metrics, strict=True):
        for k, name in enumerate(names):
            xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(results))]
            ys = [r["cells"].get(name, {}).get(key, float("nan")) for r in results]
            ax.bar(xs, ys, width, label=name, color=f"C{k}")
        ax.set_xticks(range(len(results)), [r["workload"] for r in results], fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    axes[1].axhline(0.9, color="red", lw=0.8, ls="--")
    axes[3].axhline(1.3, color="red", lw=0.8, ls="--")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests per cell (~6 minutes in all)")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--speedup", type=float, default=5.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rate", type=float, default=20.0, help="workload (a) arrivals per second")
    ap.add_argument("--kv-blocks", type=int, default=None, help="override the KV blocks per engine")
    ap.add_argument("--cell-time-limit", type=float, default=150.0, help="seconds; a cell stops sending after it")
    ap.add_argument("--workloads", default="tenants,multiturn,unique,agentic,burst")
    ap.add_argument("--routers", default=",".join(DEFAULT_ROUTERS), help="subset of " + ",".join(ROUTERS))
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--no-install", action="store_true", help="do not pip-install missing peers; skip them")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    from infera.kv.tokenizer import PromptRenderer

    tok = args.tokenizer or default_tokenizer_dir()
    renderer = PromptRenderer.from_dir(tok)
    peer_set = peers.ensure_all(install=not args.no_install)
    names = [n for n in args.routers.split(",") if n]
    skipped = {n: peer_set[ROUTERS[n][0]].error for n in names
               if ROUTERS[n][0] in peer_set and not peer_set[ROUTERS[n][0]].ok}
    names = [n for n in names if n not in skipped]
    for n, why in skipped.items():
        print(f"skipping {n}: {why}", file=sys.stderr)
    chosen = set(args.workloads.split(","))
    wls = [w for w in workloads.build(args.quick, args.max_tokens, args.rate) if w.name in chosen]
    info = machine_info()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-quality-"))
    started = time.monotonic()
    results = [run_workload(w, names, k, args, tok, log_dir, peer_set, renderer, args.kv_blocks)
               for k, w in enumerate(wls)]
    print(f"\n{info['date']}  nproc={info['nproc']}  cpu={info['cpu']}  {args.engines} mock engines "
          f"x{args.speedup:g}  max_tokens={args.max_tokens}")
    print_table(results)
    cmd = " ".join(["bench/routing_quality.py", *(sys.argv[1:] if argv is None else argv)])
    out = {"machine": info, "command": cmd, "args": {k: str(v) for k, v in vars(args).items()},
           "peers": {k: vars(v) for k, v in peer_set.items()}, "skipped": skipped, "log_dir": str(log_dir),
           "wall_s": time.monotonic() - started, "results": results}
    print(f"results: {write_results('routing_quality', out)}")
    if not args.no_plot:
        plot(results, PLOTS / "routing_quality.png",
             f"routing quality: {info['nproc']} cores, {info['date']}, {args.engines} mock engines x{args.speedup:g}, "
             f"KV = {FIT:.0%} of the hot set per engine")
    return out


if __name__ == "__main__":
    main()
