"""The prefix index and the tokenizer path in process: ingest rate, query latency, memory, render+tokenize+hash.

The index is measured side by side with the one of main 2d3553e ("old": ``bench/index_v2.py``, its
decoder and block hashing frozen with it) and the one of main 7f6bc8d ("main": ``bench/index_v3.py``, the
third round's C loops) and of main 846da7f ("main4": ``bench/index_v4.py``, the tables as Python dicts before
the fifth round moved them into C), in the same run.

  ingest   block events/s (one per stored or removed block) through ``PrefixIndex.apply``, and through
           ``decode_batch`` + ``apply`` from msgpack frames (``encode_batch``), and ("payload", where the index has
           it) through ``PrefixIndex.apply_payload`` from those frames as the frontend's feed does, for 16 workers whose
           caches are full (every store evicts), requests storing 4-32 new blocks after an optional
           64-block shared prefix (bench/synth.py). CPU time, gc off, median of rounds interleaving
           old and new.
  query    ``PrefixIndex.overlaps`` latency (p50/p99, wall) for 16/128/1024 workers and prompts of
           1k/8k/32k tokens; "few": each prompt's prefix on 1-4 workers (what kv-aware routing
           makes), "all": every worker holds a prefix of staggered depth (the worst case);
           "+pred": the same with ``use_predicted=True`` while every worker holds a prediction;
           "+churn": before each (untimed, its CPU time reported apart) a one-block store or removal
           on an extra worker changes the mask of the prompt's first block, so no query finds a
           remembered walk as it left it.
  mixed    ingest with a query between batches (16 and 128 workers, 64 shared 128-block prefixes
           re-stored and evicted all along): apply CPU per block event and query CPU per prompt (a shared
           prefix + 8 blocks), so that what remembered walks cost the event path shows beside what they
           save the queries. Interleaved rounds, gc off.
  memory   bytes per indexed block (tracemalloc, retained after applying) at 1M blocks.
  tokenize chat template render + tokenize + block hashes per prompt size (1k/8k/32k tokens).

    .venv/bin/python bench/index_bench.py [--quick] [--only ingest,query,memory,tokenize] [--workers 16,128,1024]
                                          [--impls old,main,main4,new,pure]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import synth
from bench.common import _text, default_tokenizer_dir, machine_info, percentile, write_results

WORKERS = (16, 128, 1024)
PROMPT_TOKENS = (1024, 8192, 32768)


IMPLS = ("old", "main", "main4", "new", "pure")
_selected = list(IMPLS)  # which of them run (--impls)


def _impls() -> dict[str, tuple[Any, Any]]:
    """name -> (index factory, decode function); old = main 2d3553e (bench/index_v2.py), main = main 7f6bc8d
    (bench/index_v3.py), main4 = main 846da7f (bench/index_v4.py: the tables as dicts), new = this tree as it runs
    (its C loops and tables if built: infera.kv.native), pure = this tree with ``native=False`` (when C is built)."""
    from functools import partial

    from bench import index_v2, index_v3, index_v4
    from infera.kv.index import PrefixIndex
    from infera.kv.native import load
    from infera.protocols.kv_events import decode_batch

    impls: dict[str, tuple[Any, Any]] = {"old": (index_v2.PrefixIndex, index_v2.decode_batch),
                                         "new": (PrefixIndex, decode_batch)}
    if load() is not None:
        # main 7f6bc8d's decoder is bench/index_v2's (token ids as int lists); this tree's gives packed bytes
        impls["main"] = (index_v3.PrefixIndex, index_v2.decode_batch)
        impls["main4"] = (index_v4.PrefixIndex, decode_batch)  # main 846da7f: this tree's decoder, dict tables
        impls["pure"] = (partial(PrefixIndex, native=False), decode_batch)
    return {name: impls[name] for name in _selected if name in impls}


def ingest(quick: bool) -> dict[str, Any]:
    from infera.protocols.kv_events import encode_batch

    n_req = 4000 if quick else 12000
    warm = synth.event_batches(16, 2000, capacity=4000, seed=3)
    batches = synth.event_batches(16, n_req, capacity=4000, seed=4)
    frames = [(w, encode_batch(b)) for w, b in batches]
    n_events = synth.block_events(batches)
    out: dict[str, Any] = {"workers": 16, "batches": len(batches), "block_events": n_events,
                           "stored_blocks_per_batch": n_events / len(batches)}
    impls = _impls()
    rates: dict[str, dict[str, list[float]]] = {name: {"apply": [], "decode+apply": [], "decode": []}
                                                for name in impls}
    for name, (cls, _) in impls.items():  # the frontend's path where the tree has it: apply_payload, else decode+apply
        if getattr(cls(), "takes_payloads", False):
            rates[name]["payload"] = []
    for _ in range(3 if quick else 5):
        for name, (cls, decode) in impls.items():
            for mode in rates[name]:
                index = cls()
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
                        index.apply(w, decode(f))
                elif mode == "payload":
                    for w, f in frames:
                        if not index.apply_payload(w, f):
                            index.apply(w, decode(f))
                else:
                    for _w, f in frames:
                        decode(f)
                dt = time.process_time() - t0
                gc.enable()
                rates[name][mode].append(n_events / dt)
    out["events_per_s"] = {name: {m: statistics.median(v) for m, v in r.items()} for name, r in rates.items()}
    return out


def query(quick: bool, workers: tuple[int, ...] = WORKERS) -> list[dict[str, Any]]:
    from infera.kv.hashing import block_hashes
    from infera.protocols.kv_events import BlockRemoved, BlockStored, EventBatch

    rows = []
    reps = 200 if quick else 1000
    for spread in ("few", "all"):
        for n_workers in workers:
            for name, (cls, _) in _impls().items():
                index, prompts = synth.hot_prompt_index(n_workers, max(PROMPT_TOKENS) // synth.BLOCK, spread,
                                                        index=cls())
                for mode in ("", "+churn", "+pred"):
                    use_predicted = mode == "+pred"
                    if use_predicted:  # every worker expects the first 64 blocks of every prompt
                        for k in range(n_workers):
                            for p in prompts:
                                index.predict(f"w{k}", block_hashes(p[: 64 * synth.BLOCK], synth.BLOCK),
                                              ttl=1e9, now=0.0)
                    for size in PROMPT_TOKENS:
                        hashes = [block_hashes(p[:size], synth.BLOCK) for p in prompts]
                        for h in hashes:  # each prompt once, untimed (the new index remembers its run)
                            index.overlaps(h, now=1.0, use_predicted=use_predicted)
                        lat: list[float] = []
                        cpu: list[float] = []  # on a loaded box wall time mostly measures the scheduler
                        churn: list[float] = []  # CPU of the +churn event's apply
                        gc.disable()
                        for i in range(reps):
                            h = hashes[i % len(hashes)]
                            if mode == "+churn":  # toggle block 0 of this prompt on worker "x"
                                p = prompts[i % len(prompts)]
                                on = (i // len(prompts)) % 2 == 0
                                ev = BlockStored([i % len(prompts)], None, p[: synth.BLOCK], synth.BLOCK) if on \
                                    else BlockRemoved([i % len(prompts)])
                                c0 = time.thread_time_ns()
                                index.apply("x", EventBatch(0.0, [ev]))
                                churn.append((time.thread_time_ns() - c0) / 1e3)
                            c0 = time.thread_time_ns()
                            t0 = time.perf_counter_ns()
                            found = index.overlaps(h, now=1.0, use_predicted=use_predicted)
                            lat.append((time.perf_counter_ns() - t0) / 1e3)
                            cpu.append((time.thread_time_ns() - c0) / 1e3)
                        gc.enable()
                        rows.append({"impl": name, "spread": spread + mode,
                                     "workers": n_workers, "prompt_tokens": size, "samples": len(lat),
                                     "p50_us": percentile(lat, 50), "p99_us": percentile(lat, 99),
                                     "cpu_p50_us": percentile(cpu, 50), "cpu_p99_us": percentile(cpu, 99),
                                     "holders": len(found), "best_overlap_blocks": max(found.values(), default=0),
                                     **({"churn_apply_cpu_p50_us": percentile(churn, 50),
                                         "churn_apply_cpu_p99_us": percentile(churn, 99)} if churn else {})})
                    if mode == "+churn":
                        index.remove_worker("x")
                del index
                gc.collect()
    return rows


def mixed(quick: bool, workers: tuple[int, ...] = (16, 128)) -> list[dict[str, Any]]:
    import random

    from infera.kv.hashing import block_hashes

    rows = []
    for n_workers in workers:
        n_warm, n_req = 2000, 2000 if quick else 6000
        stream = synth.event_batches(n_workers, n_warm + n_req, capacity=4000, seed=4, prefix_blocks=128)
        rng = random.Random(4)  # the prefixes event_batches drew from the same seed
        prefixes = [[t for _ in range(128) for t in synth.token_block(rng)] for _ in range(64)]
        prompts = [block_hashes(p + [t for _ in range(8) for t in synth.token_block(rng)], synth.BLOCK)
                   for p in prefixes]
        pick = [rng.randrange(64) for _ in range(n_req)]
        n_events = synth.block_events(stream[n_warm:])
        stats: dict[str, dict[str, list[float]]] = {}
        for _ in range(2 if quick else 3):
            for name, (cls, _) in _impls().items():
                index = cls()
                for w, b in stream[:n_warm]:
                    index.apply(w, b)
                for h in prompts:
                    index.overlaps(h)
                apply_ns, query = 0, []
                gc.collect()
                gc.disable()
                for (w, b), k in zip(stream[n_warm:], pick, strict=True):
                    c0 = time.thread_time_ns()
                    index.apply(w, b)
                    c1 = time.thread_time_ns()
                    index.overlaps(prompts[k])
                    query.append((time.thread_time_ns() - c1) / 1e3)
                    apply_ns += c1 - c0
                gc.enable()
                st = stats.setdefault(name, {"apply_ns_per_event": [], "query_p50": [], "query_p99": []})
                st["apply_ns_per_event"].append(apply_ns / n_events)
                st["query_p50"].append(percentile(query, 50))
                st["query_p99"].append(percentile(query, 99))
                del index
        for name, st in stats.items():
            rows.append({"impl": name, "workers": n_workers, "block_events": n_events, "queries": n_req,
                         **{k: statistics.median(v) for k, v in st.items()}})
    return rows


def memory(quick: bool) -> list[dict[str, Any]]:
    """Retained bytes per indexed block (tracemalloc), 16 workers, each block on one worker."""
    from infera.protocols.kv_events import BlockStored, EventBatch

    n_blocks = 200_000 if quick else 1_000_000
    per_batch = 32
    rows = []
    for name, (cls, _) in _impls().items():
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        index = cls()
        next_hash = 1
        for b in range(n_blocks // per_batch):  # each batch built, applied, dropped: only the index stays
            start = b * per_batch * synth.BLOCK
            tokens = list(range(start, start + per_batch * synth.BLOCK))
            hashes = list(range(next_hash, next_hash + per_batch))
            next_hash += per_batch
            index.apply(f"w{b % 16}", EventBatch(0.0, [BlockStored(hashes, None, tokens, synth.BLOCK)]))
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        blocks = sum(index.block_count(f"w{k}") for k in range(16))
        rows.append({"impl": name, "blocks": blocks, "bytes": used, "bytes_per_block": used / blocks})
        del index
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


STEPS = ("ingest", "query", "mixed", "memory", "tokenize")


def run(tok: Path, quick: bool, only: tuple[str, ...] = STEPS, workers: tuple[int, ...] = WORKERS) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine_info()}
    for step in only:
        if step == "tokenize":
            res[step] = tokenize(tok, quick)
        elif step == "query":
            res[step] = query(quick, workers)
        else:
            res[step] = globals()[step](quick)
    return res


def print_report(res: dict[str, Any]) -> None:
    if "ingest" in res:
        ing = res["ingest"]
        print(f"KV-event ingest ({ing['workers']} workers, caches full, {ing['batches']} batches, "
              f"{ing['stored_blocks_per_batch']:.0f} block events/batch), CPU time, M block events/s:")
        rates = ing["events_per_s"]
        names = [k for k in ("old", "main", "main4", "pure", "new") if k in rates]
        print(f"{'path':<14}" + "".join(f"{k:>8}" for k in names) + "".join(f"{'new/' + k:>10}" for k in names[:-1]))
        for mode in ("apply", "decode+apply", "decode"):
            print(f"{mode:<14}" + "".join(f"{rates[k][mode] / 1e6:>8.2f}" for k in names)
                  + "".join(f"{rates['new'][mode] / rates[k][mode]:>9.2f}x" for k in names[:-1]))
        if "payload" in rates.get("new", {}):
            pay = rates["new"]["payload"]
            print(f"payload (new: apply_payload from the frames, else decode+apply) {pay / 1e6:.2f}: "
                  + ", ".join(f"{pay / rates[k]['decode+apply']:.2f}x {k}'s decode+apply" for k in names))
    if "query" in res:
        pure = {(r["spread"], r["workers"], r["prompt_tokens"]): r for r in res["query"] if r["impl"] == "pure"}
        if pure:
            print("\noverlap query, this tree in pure Python (native=False), wall and CPU µs:")
            print(f"{'spread':<12}{'workers':>8}{'prompt tok':>11}{'p50':>10}{'p99':>10}{'cpu p50':>10}{'cpu p99':>10}")
            for (spread, n_workers, size), r in pure.items():
                print(f"{spread:<12}{n_workers:>8}{size:>11}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}"
                      f"{r['cpu_p50_us']:>10.1f}{r['cpu_p99_us']:>10.1f}")
        print("\noverlap query (PrefixIndex.overlaps), wall and CPU µs:")
        print(f"{'spread':<12}{'workers':>8}{'prompt tok':>11}"
              f"{'old p50':>10}{'old p99':>10}{'new p50':>10}{'new p99':>10}"
              f"{'old cpu p50':>12}{'old cpu p99':>12}{'new cpu p50':>12}{'new cpu p99':>12}{'holders':>8}")
        old = {(r["spread"], r["workers"], r["prompt_tokens"]): r for r in res["query"] if r["impl"] == "old"}
        for r in (r for r in res["query"] if r["impl"] == "new"):
            o = old.get((r["spread"], r["workers"], r["prompt_tokens"]))
            olds = f"{o['p50_us']:>10.1f}{o['p99_us']:>10.1f}" if o else f"{'':>20}"
            old_cpu = f"{o['cpu_p50_us']:>12.1f}{o['cpu_p99_us']:>12.1f}" if o else f"{'':>24}"
            print(f"{r['spread']:<12}{r['workers']:>8}{r['prompt_tokens']:>11}{olds}{r['p50_us']:>10.1f}"
                  f"{r['p99_us']:>10.1f}{old_cpu}{r['cpu_p50_us']:>12.1f}{r['cpu_p99_us']:>12.1f}{r['holders']:>8}")
    for base, label in (("main", "main (7f6bc8d)"), ("main4", "main4 (846da7f)")):
        if "query" not in res or not any(r["impl"] == base for r in res["query"]):
            continue
        main = {(r["spread"], r["workers"], r["prompt_tokens"]): r for r in res["query"] if r["impl"] == base}
        print(f"\noverlap query, {label} and new, CPU µs (churn apply: the +churn event's apply, CPU µs):")
        print(f"{'spread':<12}{'workers':>8}{'prompt tok':>11}{base + ' p50':>11}{base + ' p99':>11}{'new p50':>10}"
              f"{'new p99':>10}{'new/' + base + ' p99':>14}{base + ' apply':>12}{'new apply':>10}")
        for r in (r for r in res["query"] if r["impl"] == "new"):
            m = main.get((r["spread"], r["workers"], r["prompt_tokens"]))
            if m is None:
                continue
            apply = (f"{m['churn_apply_cpu_p50_us']:>12.1f}{r['churn_apply_cpu_p50_us']:>10.1f}"
                     if "churn_apply_cpu_p50_us" in r else "")
            print(f"{r['spread']:<12}{r['workers']:>8}{r['prompt_tokens']:>11}{m['cpu_p50_us']:>11.1f}"
                  f"{m['cpu_p99_us']:>11.1f}{r['cpu_p50_us']:>10.1f}{r['cpu_p99_us']:>10.1f}"
                  f"{r['cpu_p99_us'] / m['cpu_p99_us']:>13.2f}x{apply}")
    if "mixed" in res:
        print("\ningest with a query between batches: apply CPU ns per block event, query CPU µs (median of rounds):")
        print(f"{'impl':<7}{'workers':>8}{'apply ns/ev':>12}{'query p50':>10}{'query p99':>10}")
        for r in res["mixed"]:
            print(f"{r['impl']:<7}{r['workers']:>8}{r['apply_ns_per_event']:>12.0f}{r['query_p50']:>10.1f}"
                  f"{r['query_p99']:>10.1f}")
    if "memory" in res:
        print("\nmemory per indexed block (tracemalloc, retained):")
        for r in res["memory"]:
            print(f"  {r['impl']:<6}{r['blocks']:>9} blocks {r['bytes'] / 2**20:>8.1f} MiB "
                  f"{r['bytes_per_block']:>6.0f} B/block")
    if "tokenize" in res:
        print(f"\nrender + tokenize + hash, CPU µs per prompt (cold tokenizer cache):\n{'prompt tok':>11}{'render':>9}"
              f"{'tokenize':>10}{'hash':>8}{'total':>9}{'µs/1k tok':>10}{'tokenize warm':>14}")
        for r in res["tokenize"]:
            print(f"{r['prompt_tokens']:>11}{r['render_us']:>9.0f}{r['tokenize_us']:>10.0f}{r['hash_us']:>8.0f}"
                  f"{r['total_us']:>9.0f}{r['total_us'] / r['prompt_tokens'] * 1000:>10.0f}"
                  f"{r['tokenize_warm_us']:>14.0f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--only", default=",".join(STEPS), help="comma-separated steps: " + ",".join(STEPS))
    ap.add_argument("--workers", default=",".join(map(str, WORKERS)), help="query: comma-separated fleet sizes")
    ap.add_argument("--impls", default=",".join(IMPLS), help="indexes to run: " + ",".join(IMPLS))
    args = ap.parse_args(argv)
    _selected[:] = [s for s in args.impls.split(",") if s]
    only = tuple(s for s in args.only.split(",") if s)
    workers = tuple(int(w) for w in args.workers.split(",") if w)
    res = run(args.tokenizer or default_tokenizer_dir(), args.quick, only, workers)
    print_report(res)
    print(f"results: {write_results('index_bench', res)}")
    return res


if __name__ == "__main__":
    main()
