"""The fleet simulator's runs of one trace at several loads, side by side: a table per fleet size and a plot.

Reads the JSON documents ``python -m infera.sim`` wrote (one per fleet size and time scale; the
time scale is in the label), prints one Markdown table per fleet size (policies x loads: TTFT
p50/p90 and their ratio to round-robin's, hit ratio and its share of the fleet-capacity limit,
utilisation, the simulator's CPU seconds) and draws TTFT p90 / round-robin's and hit / capacity
limit against utilisation, one column per fleet size.

    .venv/bin/python bench/sim_loads.py bench/results/sim-mooncake-*w-t*.json --plot bench/plots/sim-mooncake-loads.png
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any


def time_scale(doc: dict[str, Any]) -> float:
    found = re.search(r"time x([0-9.e-]+)", doc["label"])
    return float(found.group(1)) if found else 1.0


def load_docs(paths: list[str], order: list[str] | None = None) -> dict[int, list[dict[str, Any]]]:
    """Documents by fleet size, lightest load (largest time scale) first; runs of the same fleet and
    time scale (policies run separately) are merged into one document, policies in ``order``."""
    merged: dict[tuple[int, float], dict[str, Any]] = {}
    for p in paths:
        doc = json.loads(Path(p).read_text())
        key = (doc["workers"], time_scale(doc))
        if key in merged:
            merged[key]["policies"] += doc["policies"]
        else:
            merged[key] = doc
    by_fleet: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (workers, _), doc in merged.items():
        if order:
            doc["policies"].sort(key=lambda r: order.index(r["policy"]) if r["policy"] in order else len(order))
        by_fleet[workers].append(doc)
    for docs in by_fleet.values():
        docs.sort(key=time_scale, reverse=True)
    return dict(sorted(by_fleet.items()))


def utilisation(doc: dict[str, Any]) -> float:
    """Round-robin's utilisation: the load the time scale offers, before any placement saves work."""
    rows = {r["policy"]: r for r in doc["policies"]}
    return float(rows.get("round-robin", doc["policies"][0])["utilisation"])


def table(workers: int, docs: list[dict[str, Any]]) -> str:
    first = docs[0]
    lim = first["limits"]
    head = (f"{workers} workers x {first['engine']['num_blocks']} blocks of {first['engine']['block_size']} tokens, "
            f"{first['requests']} requests; limits: infinite cache {lim['infinite']:.3f}, fleet-capacity LRU "
            f"{lim['capacity']:.3f}. Cells: TTFT p50 / p90 ms (p90 / round-robin's), hit ratio (hit / capacity "
            "limit); utilisation = the engines' mean share of the run spent stepping, under round-robin.")
    loads = [f"time x{time_scale(d):g}, util {utilisation(d):.2f}" for d in docs]
    lines = [head, "", "| policy | " + " | ".join(loads) + " | sim CPU s |", "|---|" + "---|" * (len(docs) + 1)]
    policies = list(dict.fromkeys(r["policy"] for d in docs for r in d["policies"]))
    for p in policies:
        cells, cpu = [], []
        for d in docs:
            rows = {r["policy"]: r for r in d["policies"]}
            if p not in rows:
                cells.append("–")
                continue
            r, rr = rows[p], rows["round-robin"]
            ratio, share = r["ttft_p90"] / rr["ttft_p90"], r["hit_ratio"] / d["limits"]["capacity"]
            cells.append(f"{r['ttft_p50'] * 1000:.0f} / {r['ttft_p90'] * 1000:.0f} ({ratio:.2f}), "
                         f"{r['hit_ratio']:.3f} ({share:.0%})")
            cpu.append(f"{r['cpu_seconds']:.0f}")
        lines.append(f"| {p} | " + " | ".join(cells) + " | " + "/".join(cpu) + " |")
    return "\n".join(lines)


def plot(by_fleet: dict[int, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(by_fleet), figsize=(5.5 * len(by_fleet), 7), squeeze=False)
    for col, (workers, docs) in enumerate(by_fleet.items()):
        top, bottom = axes[0][col], axes[1][col]
        x = [utilisation(d) for d in docs]
        for p in dict.fromkeys(r["policy"] for d in docs for r in d["policies"]):
            xs, ratios, shares = [], [], []
            for u, d in zip(x, docs, strict=True):
                rows = {r["policy"]: r for r in d["policies"]}
                if p in rows:
                    xs.append(u)
                    ratios.append(rows[p]["ttft_p90"] / rows["round-robin"]["ttft_p90"])
                    shares.append(rows[p]["hit_ratio"] / d["limits"]["capacity"])
            top.plot(xs, ratios, marker="o", label=p)
            bottom.plot(xs, shares, marker="o", label=p)
        top.axhline(0.5, color="k", linestyle=":", linewidth=1, label="target 0.5")
        top.set_yscale("log")
        top.set_ylabel("TTFT p90 / round-robin's")
        top.set_title(f"Mooncake conversation trace, {workers} workers", fontsize=9)
        top.legend(fontsize=7)
        bottom.axhline(0.9, color="k", linestyle=":", linewidth=1, label="target 90 %")
        bottom.set_ylabel("hit ratio / fleet-capacity limit")
        bottom.set_xlabel("utilisation (round-robin)")
        bottom.set_ylim(0, 1.1)
        bottom.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="JSON documents of python -m infera.sim")
    ap.add_argument("--plot", default="", help="where to draw the plot (none if empty)")
    ap.add_argument("--order", default="round-robin,least-load,kv-aware-blocks,kv-aware-ttft,kv-aware,approx-prefix",
                    help="the policies' order in the tables")
    args = ap.parse_args(argv)
    by_fleet = load_docs(args.results, args.order.split(","))
    for workers, docs in by_fleet.items():
        print(table(workers, docs) + "\n")
    if args.plot:
        plot(by_fleet, Path(args.plot))


if __name__ == "__main__":
    main()
