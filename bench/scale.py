"""Routing decision cost as the fleet grows to 1024 simulated workers, in process.

For each fleet size: ``WorkerRecord``s registered in a static fleet view, and a ``PrefixIndex`` fed
through ``apply`` with each worker's synthetic event stream (bench/synth.py): 64 tenants' real chat
prefixes (~900 tokens, the prompts of bench/common.py), each homed on 1-3 workers, plus unique tails
up to ~1000 blocks per worker. Then per request (200 distinct ~1k-token chat prompts of those tenants):

  kv decision     ``Router._context`` + ``_candidates`` + ``_pick`` (render, tokenize, hash, query,
                  score, pick): what the frontend spends before it forwards a request
  kv pick only    ``_candidates`` + ``_pick`` on a prepared context (query + score + pick)
  rr decision     the same with ``--router-policy round-robin``

CPU µs per request (median over repeats), plus the index's build rate and the process's RSS.

    .venv/bin/python bench/scale.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import synth
from bench.common import chat_body, chat_messages, default_tokenizer_dir, machine_info, write_results
from bench.routing_cpu import _Fleet, _time_stage

SIZES = (8, 64, 256, 1024)
MODEL = "bench-model"
TENANTS = 64


def _index(renderer: Any, n_workers: int, blocks_per_worker: int, seed: int = 9) -> tuple[Any, list[Any], float]:
    from infera.kv.index import PrefixIndex
    from infera.protocols.kv_events import EventBatch
    from infera.protocols.worker import WorkerRecord

    rng = random.Random(seed)
    workers = [WorkerRecord(instance_id=f"w{k:04d}", model=MODEL, http_url=f"http://127.0.0.1:{10000 + k}",
                            kv_block_size=synth.BLOCK) for k in range(n_workers)]
    prefixes = []
    for g in range(TENANTS):
        ids = renderer.chat_token_ids(chat_messages(g, TENANTS)[:3])
        n = len(ids) // synth.BLOCK
        prefixes.append([ids[i * synth.BLOCK:(i + 1) * synth.BLOCK] for i in range(n)])
    homes: dict[int, list[int]] = {k: [] for k in range(n_workers)}
    for g in range(TENANTS):
        for j in range(1 + g % 3):
            homes[(g * 7 + j * 13) % n_workers].append(g)
    streams = [synth.WorkerStream(w.instance_id, blocks_per_worker, seed * 1000 + k) for k, w in enumerate(workers)]
    batches = []
    for k, s in enumerate(streams):
        for g in homes[k]:
            batches.append((s.worker, EventBatch(time.time(), s.store(prefixes[g], 8))))
        while len(s.lru) < blocks_per_worker - 40:
            batches.append((s.worker, EventBatch(time.time(), s.store(None, rng.randint(8, 32)))))
        for g in homes[k]:  # the tenants' prefixes again, so that they are the freshest blocks
            batches.append((s.worker, EventBatch(time.time(), s.store(prefixes[g], 4))))
    index = PrefixIndex()
    n_events = synth.block_events(batches)
    t0 = time.process_time()
    for w, b in batches:
        index.apply(w, b)
    return index, workers, n_events / (time.process_time() - t0)


def run(tok: Path, quick: bool) -> dict[str, Any]:
    import orjson

    from infera.kv.tokenizer import PromptRenderer
    from infera.router.router import Router, RouteRequest, RouterOptions

    renderer = PromptRenderer.from_dir(tok)
    n = 100 if quick else 200
    repeats = 3 if quick else 5
    blocks = 600 if quick else 1000
    rows = []
    for size in SIZES:
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        index, workers, ingest = _index(renderer, size, blocks)
        bodies = [chat_body(5000 + i, MODEL, False, 8, TENANTS) for i in range(n)]
        reqs = [RouteRequest("chat", "/v1/chat/completions", b, orjson.loads(b), MODEL, 8) for b in bodies]
        row: dict[str, Any] = {"workers": size, "index_blocks": sum(index.block_count(w.instance_id) for w in workers),
                               "ingest_events_per_s": ingest}
        for policy in ("kv-aware", "round-robin"):
            router = Router(_Fleet(workers), transport=None, events=None, renderer=renderer,  # type: ignore[arg-type]
                            options=RouterOptions(policy=policy), index=index)

            def decide(i: int, r: Any = router, rq: list[Any] = reqs, name: str = policy) -> object:
                ctx = r._context.build(rq[i])  # the stages of Router.place, without holding load
                return r._picker.pick(ctx, r._candidates.pool(MODEL, "mixed", "chat"), r._policy, name)

            decide(0)
            row[f"{policy}_decision_us"] = _time_stage(decide, n, repeats)["median_us"]
            if policy == "kv-aware":
                ctxs = [router._context.build(r) for r in reqs]
                for c in ctxs:
                    c.hashes(synth.BLOCK)
                pool = router._candidates.pool(MODEL, "mixed", "chat")
                picks = [router._picker.pick(c, pool, router._policy, policy).worker.instance_id for c in ctxs]
                found = [index.overlaps(c.hashes(synth.BLOCK)) for c in ctxs]

                def pick(i: int, r: Any = router, cs: list[Any] = ctxs) -> object:
                    return r._picker.pick(cs[i], r._candidates.pool(MODEL, "mixed", "chat"), r._policy, "kv-aware")

                row["kv-aware_pick_us"] = _time_stage(pick, n, repeats)["median_us"]
                row["mean_best_overlap_blocks"] = sum(max(f.values(), default=0) for f in found) / n
                row["picked_best_overlap"] = sum(
                    f.get(p, 0) == max(f.values(), default=0) for f, p in zip(found, picks, strict=True)) / n
        row["rss_growth_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        rows.append(row)
        print(f"  {size} workers: kv decision {row['kv-aware_decision_us']:.0f} µs, pick {row['kv-aware_pick_us']:.0f} "
              f"µs, rr {row['round-robin_decision_us']:.0f} µs", file=sys.stderr)
        del index, router
    return {"machine": machine_info(), "blocks_per_worker": blocks, "requests": n, "rows": rows}


def print_report(res: dict[str, Any]) -> None:
    print(f"routing decision cost vs fleet size (CPU µs per request; ~{res['blocks_per_worker']} blocks per worker):")
    print(f"{'workers':>8}{'index blocks':>13}{'kv decision':>12}{'kv pick only':>13}{'rr decision':>12}"
          f"{'best overlap':>13}{'picked best':>12}{'ingest Mev/s':>13}{'RSS +MB':>9}")
    for r in res["rows"]:
        print(f"{r['workers']:>8}{r['index_blocks']:>13}{r['kv-aware_decision_us']:>12.0f}{r['kv-aware_pick_us']:>13.0f}"
              f"{r['round-robin_decision_us']:>12.0f}{r['mean_best_overlap_blocks']:>13.1f}"
              f"{r['picked_best_overlap']:>12.0%}{r['ingest_events_per_s'] / 1e6:>13.2f}{r['rss_growth_mb']:>9.0f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokenizer", type=Path, default=None)
    args = ap.parse_args(argv)
    res = run(args.tokenizer or default_tokenizer_dir(), args.quick)
    print_report(res)
    print(f"results: {write_results('scale', res)}")
    return res


if __name__ == "__main__":
    main()
