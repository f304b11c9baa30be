"""Issue 4's targets, each with the figure measured in one ``bench/run_all.py`` run: met or not."""

from __future__ import annotations

from typing import Any

KV = "infera kv-aware"
RR = "round-robin"
PEERS_CA = ("sglang cache_aware", "vllm cache_aware")


def _row(target: str, figure: str, met: bool | None) -> tuple[str, str, str]:
    return target, figure, "n/a (not run)" if met is None else ("**met**" if met else "**not met**")


def evaluate(run: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    q = run.get("quality")
    by_w = {r["workload"]: r["cells"] for r in q["results"]} if q else {}
    for w in ("tenants", "multiturn"):
        cells = by_w.get(w, {})
        kv, rr = cells.get(KV), cells.get(RR)
        if not kv or not rr:
            rows.append(_row(f"({w}) kv-aware TTFT p90 ≤ ½ round-robin's", "–", None))
            continue
        ratio = kv["ttft_p90_ms"] / rr["ttft_p90_ms"]
        rows.append(_row(f"({w}) kv-aware TTFT p90 ≤ 0.5 × round-robin's",
                         f"{kv['ttft_p90_ms']:.1f} vs {rr['ttft_p90_ms']:.1f} ms = {ratio:.2f}×", ratio <= 0.5))
        peers = {p: cells[p]["ttft_p90_ms"] for p in PEERS_CA if p in cells}
        rows.append(_row(f"({w}) kv-aware TTFT p90 below every peer's",
                         f"{kv['ttft_p90_ms']:.1f} ms vs " + ", ".join(f"{p} {v:.1f}" for p, v in peers.items()),
                         bool(peers) and all(kv["ttft_p90_ms"] < v for v in peers.values())))
        rows.append(_row(f"({w}) hit ratio ≥ 90 % of the limit",
                         f"{kv['hit_ratio']:.1%} of {by_w_limit(q, w):.1%} = {kv['hit_of_limit']:.1%}",
                         kv["hit_of_limit"] >= 0.9))
        rows.append(_row(f"({w}) load imbalance ≤ 1.3", f"{kv['imbalance_inflight']:.2f} (in-flight), "
                         f"{kv['imbalance_served']:.2f} (served)", kv["imbalance_inflight"] <= 1.3))
    cells = by_w.get("unique", {})
    if cells.get(KV) and cells.get(RR):
        ratio = cells[KV]["out_tok_s"] / cells[RR]["out_tok_s"]
        rows.append(_row("(unique) kv-aware throughput within 5 % of round-robin",
                         f"{cells[KV]['out_tok_s']:.0f} vs {cells[RR]['out_tok_s']:.0f} tok/s = {ratio:.3f}×",
                         ratio >= 0.95))
    else:
        rows.append(_row("(unique) kv-aware throughput within 5 % of round-robin", "–", None))
    ov = run.get("overhead")
    s = ov["summary"] if ov else {}
    peer_names = [n for n in ("sgl-rr", "sgl-ca", "vllm-rr", "vllm-ca") if n in s]
    for cell in ("non-stream c=1", "stream c=1"):
        if "rr" in s and peer_names:
            best = min(peer_names, key=lambda n: s[n][cell]["added_p50_ms"])
            mine = s["rr"][cell]["added_p50_ms"]
            theirs = s[best][cell]["added_p50_ms"]
            row = _row(f"overhead: round-robin added p50 ≤ best peer's ({cell})",
                       f"{mine:+.2f} ms vs {best} {theirs:+.2f} ms", mine <= theirs)
            if min(mine, theirs) < 0:  # below the noise of this run: no verdict either way
                row = (row[0], row[1] + " (negative: below this run's noise)", "inconclusive")
            rows.append(row)
        else:
            rows.append(_row(f"overhead: round-robin added p50 ≤ best peer's ({cell})", "–", None))
    ca = [n for n in ("sgl-ca", "vllm-ca") if n in s]
    if "kv" in s and ca:
        cheapest = min(ca, key=lambda n: s[n]["all"]["router_cpu_us_per_req"])
        mine = s["kv"]["all"]["router_cpu_us_per_req"]
        theirs = s[cheapest]["all"]["router_cpu_us_per_req"]
        rows.append(_row("overhead: kv-aware CPU/request ≤ cheapest peer cache-aware",
                         f"{mine:.0f} vs {cheapest} {theirs:.0f} µs = {mine / theirs:.2f}×", mine <= theirs))
    else:
        rows.append(_row("overhead: kv-aware CPU/request ≤ cheapest peer cache-aware", "–", None))
    ix = run.get("index")
    if ix:
        rates = ix["ingest"]["events_per_s"]["new"]
        rows.append(_row("index: ≥ 1 M block events/s ingest (decode+apply)",
                         f"decode+apply {rates['decode+apply'] / 1e6:.2f} M/s; apply {rates['apply'] / 1e6:.2f} M/s",
                         rates["decode+apply"] >= 1e6))
        for spread in ("few", "all", "all+churn", "all+pred"):
            hit = [r for r in ix["query"] if r["spread"] == spread and r["workers"] == 1024
                   and r["prompt_tokens"] == 32768 and r.get("impl", "new") == "new"]
            if hit:
                p99 = hit[0]["p99_us"]
                rows.append(_row(f"index: overlap query p99 < 1 ms at 1024 workers, 32k tokens ({spread})",
                                 f"p99 {p99 / 1000:.2f} ms (p50 {hit[0]['p50_us'] / 1000:.2f} ms)", p99 < 1000))
    else:
        rows.append(_row("index: ingest and query targets", "–", None))
    return rows


def by_w_limit(q: dict[str, Any], workload: str) -> float:
    return next(float(r["limit"]["limit"]) for r in q["results"] if r["workload"] == workload)


def section(run: dict[str, Any]) -> str:
    rows = evaluate(run)
    met = sum(1 for r in rows if r[2] == "**met**")
    lines = [f"Every target of issue 4 against the figure measured in the run above (`{run['command']}`, "
             f"{run['machine']['date']}): {met} of {len(rows)} met.", "",
             "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {f} | {v} |" for t, f, v in rows]
    return "\n".join([*lines, ""])


def print_targets(run: dict[str, Any]) -> None:
    for t, f, v in evaluate(run):
        print(f"{v.strip('*'):<14} {t:<72} {f}")
