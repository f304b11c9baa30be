"""Markdown for bench/README.md from one ``bench/run_all.py`` run: the owned sections and the targets.

Owned sections (replaced in place, or appended in this order when missing): ``## Peers``,
``## Routing quality``, ``## Index and tokenizer``, ``## Scale``, ``## Targets``. Every other section
of the README is left as it is (the file is re-read just before it is written).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

OWNED = ("Peers", "Routing quality", "Index and tokenizer", "Scale", "Targets")
CELLS = ("non-stream c=1", "stream c=1", "non-stream c=32", "stream c=32")


def _f(x: float, nd: int = 1) -> str:
    return "–" if x != x else f"{x:.{nd}f}"


def _header(run: dict[str, Any]) -> str:
    m = run["machine"]
    return (f"Run {m['date']}, `{run['command']}`, nproc={m['nproc']}, {m['cpu']}, Python {m['python']}, "
            f"load average at start {' '.join(m['loadavg_at_start'])} (a shared box: read ratios, not absolutes). "
            f"Peers: " + ", ".join(f"{k} {v['version'] or '(missing: ' + v['error'] + ')'}"
                                   for k, v in run.get("peers", {}).items()) + ".")


def peers_section(run: dict[str, Any]) -> str:
    ov = run.get("overhead")
    if not ov:
        return "Not run (skipped).\n"
    s = ov["summary"]
    lines = [_header(run), "",
             f"Overhead (`bench/router_overhead.py`, {ov['args']['rounds']} round(s), medians; 2 mock engines "
             f"x{float(ov['args']['speedup']):g}, ~1k-token chat, max_tokens {ov['args']['max_tokens']}; added = "
             f"p50 minus the direct connection's; CPU = the router process's utime+stime per request over all cells):",
             "", "| router | " + " | ".join(f"added p50 ms {c}" for c in CELLS) + " | req/s c=32 non-stream | "
             "router CPU µs/req |", "|---|" + "--:|" * (len(CELLS) + 2)]
    for name, by_cell in s.items():
        if name in ("direct", "direct-2"):
            continue
        added = " | ".join(_f(by_cell[c].get("added_p50_ms", float("nan")), 2) for c in CELLS)
        lines.append(f"| {name} | {added} | {by_cell['non-stream c=32']['rps']:.0f} | "
                     f"{by_cell['all']['router_cpu_us_per_req']:.0f} |")
    if "direct" in s:
        d = s["direct"]
        lines.append("| direct (floor: p50 ms) | " + " | ".join(_f(d[c]["p50_ms"], 2) for c in CELLS)
                     + f" | {d['non-stream c=32']['rps']:.0f} | – |")
    lines += ["", "Scenario names: rr/kv = infera round-robin/kv-aware (one frontend), kv-x2 = two kv-aware frontends, "
              "sgl-* = sglang-router, vllm-* = vllm-router, -rr = round_robin, -ca = cache_aware. "
              + (f"Skipped: {ov['skipped']}." if ov.get("skipped") else ""),
              "Added latency is the difference of two noisy medians taken minutes apart on a shared 2-core box; "
              "a negative figure means the direct cell's round was slower than the routed one, i.e. the added "
              "latency was below this run's noise. CPU per request (from /proc) is the robust comparison.",
              "", "![router overhead with peers](plots/router_overhead_peers.png)", ""]
    return "\n".join(lines)


def quality_section(run: dict[str, Any]) -> str:
    q = run.get("quality")
    if not q:
        return "Not run (skipped).\n"
    a = q["args"]
    lines = [_header(run), "",
             f"`bench/routing_quality.py`: {a['engines']} mock engines x{float(a['speedup']):g} (Dynamo's mocker "
             f"timing), max_tokens {a['max_tokens']}, streaming chat; each engine's KV cache = 70 % of the blocks the "
             f"workload needs cached at once (all tenants' system prompts; the live conversations; the in-flight "
             f"prompts). TTFT = first streamed chunk at the client; hit = engines' prefix-cache hits / queries "
             f"(tokens); limit = an infinite cache's hit ratio for the same prompts; imbalance = busiest engine's "
             f"time-averaged in-flight / the mean (sampled every 0.25 s), served = the same for requests served.",
             "", "| workload | router | TTFT p50 ms | TTFT p90 ms | p90 / rr | out tok/s | / rr | hit | limit | "
             "hit / limit | imbalance | served | router CPU µs/req |", "|---|---|" + "--:|" * 11]
    for r in q["results"]:
        base = r["cells"].get("round-robin")
        for name, c in r["cells"].items():
            p90 = c["ttft_p90_ms"] / base["ttft_p90_ms"] if base else float("nan")
            tps = c["out_tok_s"] / base["out_tok_s"] if base else float("nan")
            err = f" ({c['errors']} errors)" if c["errors"] else ""
            lines.append(f"| {r['label']} | {name}{err} | {_f(c['ttft_p50_ms'])} | {_f(c['ttft_p90_ms'])} | "
                         f"{_f(p90, 2)} | {c['out_tok_s']:.0f} | {_f(tps, 3)} | {c['hit_ratio']:.1%} | "
                         f"{r['limit']['limit']:.1%} | {c['hit_of_limit']:.1%} | {_f(c['imbalance_inflight'], 2)} | "
                         f"{_f(c['imbalance_served'], 2)} | {c['router_cpu_us_per_req']:.0f} |")
    lines += ["", "Workload sizes: " + "; ".join(
        f"{r['workload']}: {r['params']}, mean prompt {r['limit']['mean_prompt_tokens']:.0f} tokens, "
        f"{r['kv_blocks_per_engine']} KV blocks per engine" for r in q["results"]) + ".",
              "", "![routing quality](plots/routing_quality.png)", ""]
    return "\n".join(lines)


def index_section(run: dict[str, Any]) -> str:
    ix = run.get("index")
    if not ix:
        return "Not run (skipped).\n"
    lines = [_header(run), "", "`bench/index_bench.py` (in process): old = the index, walk, hashing and decoder of "
             "main 2d3553e (`bench/index_v2.py`), new = this tree, side by side in one run."]
    ing = ix.get("ingest")
    if ing:
        lines += ["", f"KV-event ingest, {ing['workers']} workers with full caches (each store evicts; one block event "
                  f"per stored or removed block, {ing['stored_blocks_per_batch']:.0f} per batch), CPU time, median "
                  "of interleaved rounds, gc off:", "",
                  "| path | old M block events/s | new M block events/s | new / old |", "|---|--:|--:|--:|"]
        for mode in ("apply", "decode+apply", "decode"):
            old, new = (ing["events_per_s"][k][mode] for k in ("old", "new"))
            lines.append(f"| {mode} | {old / 1e6:.2f} | {new / 1e6:.2f} | {new / old:.1f}× |")
    if ix.get("memory"):
        lines += ["", "Memory per indexed block (tracemalloc, retained after applying; 16 workers, each block on one):",
                  "", "| index | blocks | MiB | bytes per block |", "|---|--:|--:|--:|"]
        for r in ix["memory"]:
            lines.append(f"| {r['impl']} | {r['blocks']} | {r['bytes'] / 2**20:.0f} | {r['bytes_per_block']:.0f} |")
    if ix.get("query"):
        lines += ["", "Overlap query (`PrefixIndex.overlaps`, wall µs); few = each prompt's prefix on 1–4 workers "
                  "(what kv-aware routing makes), all = every worker holds a prefix of staggered depth (worst case); "
                  "+pred = `use_predicted=True` with a live prediction on every worker; +churn = before each query "
                  "(untimed) a one-block change on an extra worker alters the prompt's first mask, so the new index "
                  "never resumes a remembered walk (its cold path):", "",
                  "| spread | workers | prompt tokens | old p50 µs | old p99 µs | new p50 µs | new p99 µs "
                  "| new CPU p50 µs | new CPU p99 µs | old CPU p50 µs | old CPU p99 µs |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        old_rows = {(r["spread"], r["workers"], r["prompt_tokens"]): r for r in ix["query"] if r.get("impl") == "old"}
        for r in ix["query"]:
            if r.get("impl", "new") != "new":
                continue
            o = old_rows.get((r["spread"], r["workers"], r["prompt_tokens"]))
            olds = f"{o['p50_us']:.1f} | {o['p99_us']:.1f}" if o else "– | –"
            old_cpu = f"{o['cpu_p50_us']:.1f} | {o['cpu_p99_us']:.1f}" if o and "cpu_p50_us" in o else "– | –"
            new_cpu = f"{r['cpu_p50_us']:.1f} | {r['cpu_p99_us']:.1f}" if "cpu_p50_us" in r else "– | –"
            lines.append(f"| {r['spread']} | {r['workers']} | {r['prompt_tokens']} | {olds} | {r['p50_us']:.1f} | "
                         f"{r['p99_us']:.1f} | {new_cpu} | {old_cpu} |")
    lines += ["", "Chat template + tokenize + block hashes per prompt (CPU µs, distinct prompts, cold tokenizer "
              "segment cache; warm = the same text again):", "",
              "| prompt tokens | render | tokenize | hash | total | µs per 1k tokens | tokenize warm |",
              "|--:|--:|--:|--:|--:|--:|--:|"]
    for r in ix.get("tokenize", []):
        lines.append(f"| {r['prompt_tokens']} | {r['render_us']:.0f} | {r['tokenize_us']:.0f} | {r['hash_us']:.0f} | "
                     f"{r['total_us']:.0f} | {r['total_us'] / r['prompt_tokens'] * 1000:.0f} | "
                     f"{r['tokenize_warm_us']:.0f} |")
    lines += ["", "![index and scale](plots/index_scale.png)", ""]
    return "\n".join(lines)


def scale_section(run: dict[str, Any]) -> str:
    sc = run.get("scale")
    if not sc:
        return "Not run (skipped).\n"
    lines = [_header(run), "", f"`bench/scale.py` (in process): WorkerRecords in a static fleet view, a PrefixIndex "
             f"fed with each worker's synthetic event stream (~{sc['blocks_per_worker']} blocks per worker, 64 "
             f"tenants' real chat prefixes on 1–3 workers each), {sc['requests']} distinct ~1k-token chat prompts. "
             f"CPU µs per routing decision (kv = render + tokenize + hash + query + score + pick; pick only = on a "
             f"prepared context):", "",
             "| workers | index blocks | kv decision µs | kv pick only µs | rr decision µs | picked the best overlap "
             "| ingest M events/s (gc on) | RSS growth MB |", "|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in sc["rows"]:
        lines.append(f"| {r['workers']} | {r['index_blocks']} | {r['kv-aware_decision_us']:.0f} | "
                     f"{r['kv-aware_pick_us']:.0f} | {r['round-robin_decision_us']:.0f} | "
                     f"{r['picked_best_overlap']:.0%} | {r['ingest_events_per_s'] / 1e6:.2f} | "
                     f"{r['rss_growth_mb']:.0f} |")
    return "\n".join([*lines, ""])


def write_readme(path: Path, sections: dict[str, str]) -> None:
    """Replace (or append) the owned ``## `` sections of ``path``; leave the others untouched."""
    text = path.read_text() if path.exists() else ""
    parts = re.split(r"(?m)^(?=## )", text)
    head, body = (parts[0], parts[1:]) if parts and not parts[0].startswith("## ") else ("", parts)
    out = [head] if head else []
    done = set()
    for part in body:
        title = part.splitlines()[0][3:].strip()
        if title in sections:
            out.append(f"## {title}\n\n{sections[title].rstrip()}\n\n")
            done.add(title)
        else:
            out.append(part if part.endswith("\n\n") else part.rstrip("\n") + "\n\n")
    for title in OWNED:
        if title in sections and title not in done:
            out.append(f"## {title}\n\n{sections[title].rstrip()}\n\n")
    path.write_text("".join(out).rstrip("\n") + "\n")
