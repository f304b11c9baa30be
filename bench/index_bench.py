"""The prefix index and the tokenizer path in process: ingest rate, query latency, render+tokenize+hash.

  ingest   block events/s (one per stored or removed block) through ``PrefixIndex.apply``, and through
           ``decode_batch`` + ``apply`` from msgpack frames (``encode_batch``), for 16 workers whose
           caches are full (every store evicts), requests storing 4-32 new blocks after an optional
           64-block shared prefix (bench/synth.py).
  query    ``PrefixIndex.overlaps`` latency (p50/p99, wall) for 16/128/1024 workers and prompts of
           1k/8k/32k tokens; "few": each prompt's prefix on 1-4 workers (what kv-aware routing
           makes), "all": every worker holds a prefix of staggered depth (the worst case).
  tokenize chat template render + tokenize + block hashes per prompt size (1k/8k/32k tokens).

    .venv/bin/python bench/index_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import synth
from bench.common import _text, default_tokenizer_dir, machine_info, percentile, write_results

WORKERS = (16, 128, 1024)
PROMPT_TOKENS = (1024, 8192, 32768)


def ingest(quick: bool) -> dict[str, Any]:
    from infera.kv.index import PrefixIndex
    from infera.protocols.kv_events import decode_batch, encode_batch

    n_req = 4000 if quick else 12000
    warm = synth.event_batches(16, 2000, capacity=4000, seed=3)
    batches = synth.event_batches(16, n_req, capacity=4000, seed=4)
    frames = [(w, encode_batch(b)) for w, b in batches]
    n_events = synth.block_events(batches)
    out: dict[str, Any] = {"workers": 16, "batches": len(batches), "block_events": n_events,
                           "stored_blocks_per_batch": n_events / len(batches)}
    rates: dict[str, list[float]] = {"apply": [], "decode+apply": [], "decode": []}
    for _ in range(2 if quick else 3):
        for mode in rates:
            index = PrefixIndex()
            for w, b in warm if mode != "decode" else []:  # caches full before timing
                index.apply(w, b)
            gc.collect()
            gc.disable()
            t0 = time.process_time()
            if mode == "apply":
                for w, b in batches:
                    index.apply(w, b)
            elif mode == "decode+apply":
                for w, f in frames:
                    index.apply(w, decode_batch(f))
            else:
                for _w, f in frames:
                    decode_batch(f)
            dt = time.process_time() - t0
            gc.enable()
            rates[mode].append(n_events / dt)
    out["events_per_s"] = {m: statistics.median(v) for m, v in rates.items()}
    out["orphans"] = index.counters.orphan_blocks
    return out


def query(quick: bool) -> list[dict[str, Any]]:
    from infera.kv.hashing import block_hashes

    rows = []
    reps = 200 if quick else 1000
    for spread in ("few", "all"):
        for n_workers in WORKERS:
            index, prompts = synth.hot_prompt_index(n_workers, max(PROMPT_TOKENS) // synth.BLOCK, spread)
            for size in PROMPT_TOKENS:
                hashes = [block_hashes(p[:size], synth.BLOCK) for p in prompts]
                index.overlaps(hashes[0])
                lat = []
                gc.disable()
                for i in range(reps):
                    h = hashes[i % len(hashes)]
                    t0 = time.perf_counter_ns()
                    found = index.overlaps(h)
                    lat.append((time.perf_counter_ns() - t0) / 1e3)
                gc.enable()
                rows.append({"spread": spread, "workers": n_workers, "prompt_tokens": size,
                             "p50_us": percentile(lat, 50), "p99_us": percentile(lat, 99),
                             "holders": len(found), "best_overlap_blocks": max(found.values(), default=0)})
            del index
            gc.collect()
    return rows


def _messages(tokens: int, renderer: Any, seed: int) -> list[dict[str, str]]:
    """A system + user conversation of about ``tokens`` tokens, distinct for each ``seed``."""
    import random

    rng = random.Random(seed)
    words = int(tokens * 0.78)
    msgs = [{"role": "system", "content": f"{seed} " + _text(rng, words // 4)},
            {"role": "user", "content": _text(rng, words - words // 4)}]
    for _ in range(3):  # scale the user turn to hit the size within a few %
        n = len(renderer.chat_token_ids(msgs))
        words = int(words * tokens / n)
        msgs[1]["content"] = _text(rng, max(words - words // 4, 1))
    return msgs


def tokenize(tok: Path, quick: bool) -> list[dict[str, Any]]:
    """Per prompt size, each stage's CPU µs (median over distinct prompts, each seen once: the
    tokenizer's segment cache is cold) and the tokenize time when the same text repeats (warm)."""
    from infera.kv.hashing import block_hashes
    from infera.kv.tokenizer import PromptRenderer

    sizer = PromptRenderer.from_dir(tok)
    renderer = PromptRenderer.from_dir(tok)  # its own cache: only the timed loop fills it
    rows = []
    for size in PROMPT_TOKENS:
        n = max(5, (24 if quick else 60) * 1024 // size)
        convs = [_messages(size, sizer, size * 1000 + k) for k in range(n)]
        times: dict[str, list[float]] = {"render": [], "tokenize": [], "hash": [], "tokenize_warm": []}
        lens = []
        for msgs in convs:
            t0 = time.process_time_ns()
            text = renderer.render_chat(msgs)
            t1 = time.process_time_ns()
            ids = renderer.encode(text)
            t2 = time.process_time_ns()
            block_hashes(ids, synth.BLOCK)
            t3 = time.process_time_ns()
            renderer.encode(text)
            t4 = time.process_time_ns()
            for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[k].append(v / 1e3)
            lens.append(len(ids))
        row: dict[str, Any] = {"prompt_tokens": int(statistics.median(lens)), "prompts": n}
        row.update({f"{k}_us": statistics.median(v) for k, v in times.items()})
        row["total_us"] = row["render_us"] + row["tokenize_us"] + row["hash_us"]
        rows.append(row)
    return rows


def run(tok: Path, quick: bool) -> dict[str, Any]:
    return {"machine": machine_info(), "ingest": ingest(quick), "query": query(quick), "tokenize": tokenize(tok, quick)}


def print_report(res: dict[str, Any]) -> None:
    ing = res["ingest"]
    print(f"KV-event ingest ({ing['workers']} workers, caches full, {ing['batches']} batches, "
          f"{ing['stored_blocks_per_batch']:.0f} block events/batch), CPU time:")
    for mode, rate in ing["events_per_s"].items():
        print(f"  {mode:<14}{rate / 1e6:>8.2f} M block events/s")
    print(f"\noverlap query (PrefixIndex.overlaps), wall µs:\n{'spread':<7}{'workers':>8}{'prompt tok':>11}"
          f"{'p50 µs':>9}{'p99 µs':>9}{'holders':>8}")
    for r in res["query"]:
        print(f"{r['spread']:<7}{r['workers']:>8}{r['prompt_tokens']:>11}{r['p50_us']:>9.1f}{r['p99_us']:>9.1f}"
              f"{r['holders']:>8}")
    print(f"\nrender + tokenize + hash, CPU µs per prompt (cold tokenizer cache):\n{'prompt tok':>11}{'render':>9}"
          f"{'tokenize':>10}{'hash':>8}{'total':>9}{'µs/1k tok':>10}{'tokenize warm':>14}")
    for r in res["tokenize"]:
        print(f"{r['prompt_tokens']:>11}{r['render_us']:>9.0f}{r['tokenize_us']:>10.0f}{r['hash_us']:>8.0f}"
              f"{r['total_us']:>9.0f}{r['total_us'] / r['prompt_tokens'] * 1000:>10.0f}{r['tokenize_warm_us']:>14.0f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokenizer", type=Path, default=None)
    args = ap.parse_args(argv)
    res = run(args.tokenizer or default_tokenizer_dir(), args.quick)
    print_report(res)
    print(f"results: {write_results('index_bench', res)}")
    return res


if __name__ == "__main__":
    main()
