"""The simulator's outputs: a side-by-side table, a JSON document and a plot per workload."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = (
    ("policy", "policy", "{}"),
    ("ttft_p50", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p90", "p90 ms", "{:.0f}"),
    ("ttft_p99", "p99 ms", "{:.0f}"),
    ("itl_mean", "ITL mean ms", "{:.1f}"),
    ("itl_p90", "ITL p90 ms", "{:.1f}"),
    ("queue_p90", "queue p90 ms", "{:.0f}"),
    ("hit_ratio", "hit ratio", "{:.3f}"),
    ("imbalance_tokens", "imbal tokens", "{:.2f}"),
    ("imbalance_running", "imbal running", "{:.2f}"),
    ("preemptions", "preempt", "{}"),
    ("utilisation", "util", "{:.2f}"),
    ("cpu_seconds", "sim CPU s", "{:.0f}"),
)
MS = {"ttft_p50", "ttft_p90", "ttft_p99", "itl_mean", "itl_p90", "queue_p90"}


def table(doc: dict[str, Any]) -> str:
    """A Markdown table of one workload's policies, with the limits in the heading."""
    lim = doc["limits"]
    lines = [f"{doc['label']}: {doc['workers']} workers x {doc['engine']['num_blocks']} blocks of "
             f"{doc['engine']['block_size']} tokens, {doc['requests']} requests; hit-ratio limits: infinite cache "
             f"{lim['infinite']:.3f}, fleet-capacity LRU {lim['capacity']:.3f}",
             "",
             "| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for row in doc["policies"]:
        cells = []
        for key, _, fmt in COLUMNS:
            value = row[key]
            cells.append(fmt.format(value * 1000 if key in MS else value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def plot(docs: Sequence[dict[str, Any]], path: Path) -> None:
    """TTFT p50/p90 and hit ratio (with both limits) per policy, one column per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(docs), figsize=(4.5 * len(docs), 6.5), squeeze=False)
    for col, doc in enumerate(docs):
        rows = doc["policies"]
        names = [r["policy"] for r in rows]
        x = range(len(rows))
        top, bottom = axes[0][col], axes[1][col]
        top.bar([i - 0.2 for i in x], [r["ttft_p50"] * 1000 for r in rows], 0.4, label="p50")
        top.bar([i + 0.2 for i in x], [r["ttft_p90"] * 1000 for r in rows], 0.4, label="p90")
        top.set_xticks(list(x), names, rotation=20, fontsize=8)
        top.set_ylabel("TTFT ms")
        top.set_title(f"{doc['name']}, {doc['workers']} workers", fontsize=9)
        top.legend(fontsize=7)
        bottom.bar(list(x), [r["hit_ratio"] for r in rows], 0.6, color="tab:green")
        bottom.axhline(doc["limits"]["infinite"], color="k", linestyle="--", linewidth=1, label="infinite cache")
        bottom.axhline(doc["limits"]["capacity"], color="tab:red", linestyle=":", linewidth=1, label="fleet LRU")
        bottom.set_xticks(list(x), names, rotation=20, fontsize=8)
        bottom.set_ylabel("hit ratio")
        bottom.set_ylim(0, 1)
        bottom.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
