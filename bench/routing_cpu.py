"""The kv-aware routing path in process, stage by stage, for a ~1k-token chat prompt.

Stages (each timed in its own loop over 200 distinct requests; CPU time, median of 5-9 repeats):

  render    chat template -> prompt text     (PromptRenderer.render_chat)
  tokenize  prompt text -> token ids         (PromptRenderer.encode, no special tokens)
  hash      token ids -> chained block hashes (infera.kv.hashing.block_hashes, block 16)
  query     hashes -> per-worker overlap     (PrefixIndex.overlaps)
  score     candidates -> costs              (KvAwarePolicy.score minus its query)

The index holds realistic contents for 8 workers: ~4000 blocks each, fed through
``PrefixIndex.apply`` as vLLM-style ``BlockStored`` events (64 tenant prefixes, each on
one or two workers, plus many unique conversation tails). The budget for
render + tokenize + hash + query + score is 500 µs. For reference it also times what
else the frontend does per request (JSON parse + request validation, the router's
``_context`` + ``_pick`` as a whole, and the bookkeeping after the pick).

Then the prompt stage alone vs prompt length (1k-32k tokens) and turn number, without
and with the prompt cache (bench/prompt_sweep.py; table + bench/plots/prompt_cpu.png).

    .venv/bin/python bench/routing_cpu.py [--quick] [--no-sweep]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import chat_body, chat_messages, default_tokenizer_dir, machine_info, write_results

BUDGET_US = 500.0
BLOCK = 16
N_WORKERS = 8
BLOCKS_PER_WORKER = 4000
N_PREFIXES = 64
MODEL = "bench-model"


def _time_stage(fn: Callable[[int], object], n: int, repeats: int) -> dict[str, float]:
    """µs of CPU time per call of fn(i) for i in range(n): median and min over ``repeats`` loops.

    CPU time of this process (CLOCK_PROCESS_CPUTIME_ID), not wall time: on a shared box the
    wall clock also counts the time other processes held the core. Wall time is kept too.
    """
    per: list[float] = []
    wall: list[float] = []
    gc_was = gc.isenabled()
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        w0 = time.perf_counter_ns()
        t0 = time.process_time_ns()
        for i in range(n):
            fn(i)
        per.append((time.process_time_ns() - t0) / n / 1e3)
        wall.append((time.perf_counter_ns() - w0) / n / 1e3)
        if gc_was:
            gc.enable()
    return {"median_us": statistics.median(per), "min_us": min(per), "wall_median_us": statistics.median(wall)}


def build_index(renderer: Any, seed: int = 1) -> tuple[Any, list[Any], dict[str, Any]]:
    """A PrefixIndex holding ~BLOCKS_PER_WORKER blocks on each of N_WORKERS workers."""
    from infera.kv.index import PrefixIndex
    from infera.protocols.kv_events import BlockStored, EventBatch
    from infera.protocols.worker import WorkerRecord

    rng = random.Random(seed)
    index = PrefixIndex()
    workers = [WorkerRecord(instance_id=f"w{k}", model=MODEL, http_url=f"http://127.0.0.1:{9000 + k}",
                            kv_block_size=BLOCK) for k in range(N_WORKERS)]
    prefix_ids = [renderer.chat_token_ids(chat_messages(g, N_PREFIXES)) for g in range(N_PREFIXES)]
    shared_blocks = [len(renderer.chat_token_ids(chat_messages(g, N_PREFIXES)[:3])) // BLOCK
                     for g in range(N_PREFIXES)]
    homes = {g: [g % N_WORKERS] + ([(g * 5 + 3) % N_WORKERS] if g % 3 == 0 else []) for g in range(N_PREFIXES)}
    events = 0
    for k, w in enumerate(workers):
        wid = w.instance_id
        stored_chain: dict[tuple[int, int], int] = {}  # (group, block i) -> engine hash
        mine = [g for g in range(N_PREFIXES) if k in homes[g]]
        total = 0
        for g in mine:  # the tenant's whole first prompt
            ids = prefix_ids[g]
            n = len(ids) // BLOCK
            hashes = [rng.getrandbits(64) for _ in range(n)]
            for i, h in enumerate(hashes):
                stored_chain[(g, i)] = h
            index.apply(wid, EventBatch(time.time(), [BlockStored(hashes, None, ids[: n * BLOCK], BLOCK)]))
            events += 1
            total += n
        while total < BLOCKS_PER_WORKER:  # later conversations: a tenant prefix + a unique tail
            g = rng.choice(mine)
            cut = shared_blocks[g]
            parent = stored_chain[(g, cut - 1)]
            n = rng.randint(4, 24)
            tail = [rng.randrange(1000, 150000) for _ in range(n * BLOCK)]
            hashes = [rng.getrandbits(64) for _ in range(n)]
            index.apply(wid, EventBatch(time.time(), [BlockStored(hashes, parent, tail, BLOCK)]))
            events += 1
            total += n
    info = {"workers": N_WORKERS, "blocks": {w.instance_id: index.block_count(w.instance_id) for w in workers},
            "events": events, "prefixes": N_PREFIXES, "block_size": BLOCK}
    return index, workers, info


class _Fleet:
    def __init__(self, workers: list[Any]) -> None:
        self._workers = {w.instance_id: w for w in workers}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def workers(self) -> dict[str, Any]:
        return self._workers

    def subscribe(self, listener: Any) -> None:
        return None


def run(tok: Path, quick: bool = False, n: int = 200) -> dict[str, Any]:
    import orjson

    from infera.kv.hashing import block_hashes
    from infera.kv.tokenizer import PromptRenderer
    from infera.protocols.openai import ChatCompletionRequest
    from infera.router.base import Candidate, PolicyDeps, RoutingContext
    from infera.router.kv_aware import KvAwarePolicy

    repeats = 5 if quick else 9
    renderer = PromptRenderer.from_dir(tok)
    index, workers, index_info = build_index(renderer)
    # Requests: 64 tenants (all cached somewhere), each with a unique last turn.
    msgs = [chat_messages(1000 + i, N_PREFIXES) for i in range(n)]
    texts = [renderer.render_chat(m) for m in msgs]
    ids = [renderer.encode(t, add_special_tokens=False) for t in texts]
    hashes = [block_hashes(x, BLOCK) for x in ids]
    found = [index.overlaps(h) for h in hashes]
    stages: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    stages["render"] = _time_stage(lambda i: renderer.render_chat(msgs[i]), n, repeats)
    stages["tokenize"] = _time_stage(lambda i: renderer.encode(texts[i], add_special_tokens=False), n, repeats)
    stages["hash"] = _time_stage(lambda i: block_hashes(ids[i], BLOCK), n, repeats)
    stages["query"] = _time_stage(lambda i: index.overlaps(hashes[i]), n, repeats)
    # score: the policy as the router calls it (it queries the index itself; subtract that).
    policy = KvAwarePolicy(PolicyDeps(index, 1.0, lambda _w: False))
    cands = [Candidate(w, k % 3, (k % 4) * 100, 64 * (k % 5)) for k, w in enumerate(workers)]
    ctxs = [RoutingContext(MODEL, ids[i], len(ids[i]), 8) for i in range(n)]
    for i, c in enumerate(ctxs):
        c._hashes[BLOCK] = hashes[i]  # pre-hashed: time the policy's own work only
    try:
        policy.score(ctxs[0], cands)
        full = _time_stage(lambda i: policy.score(ctxs[i], cands), n, repeats)
        stages["score"] = {k: max(0.0, full[k] - stages["query"][k]) for k in full}  # policy minus its query
        stages["score"]["policy_score_incl_query_us"] = full["median_us"]
    except Exception as exc:
        errors["score"] = f"KvAwarePolicy.score raised {type(exc).__name__}: {exc}"
    budget_sum = sum(stages[s]["median_us"] for s in ("render", "tokenize", "hash", "query", "score") if s in stages)
    # Context: what else the frontend spends per request, outside the budget's stages.
    extra: dict[str, dict[str, float]] = {}
    bodies = [chat_body(1000 + i, MODEL, False, 8, N_PREFIXES) for i in range(n)]
    extra["json parse + validate"] = _time_stage(
        lambda i: ChatCompletionRequest.model_validate(orjson.loads(bodies[i])), n, repeats)
    try:
        from infera.router.router import Router, RouteRequest, RouterOptions

        router = Router(_Fleet(workers), transport=None, events=None, renderer=renderer,  # type: ignore[arg-type]
                        options=RouterOptions(policy="kv-aware"), index=index)
        reqs = [RouteRequest("chat", "/v1/chat/completions", bodies[i], orjson.loads(bodies[i]), MODEL, 8)
                for i in range(n)]

        def route(i: int) -> object:  # the stages of Router.place, without holding load
            ctx = router._context.build(reqs[i])
            return router._picker.pick(ctx, router._candidates.pool(MODEL, "mixed", "chat"), router._policy,
                                       "kv-aware")

        route(0)
        extra["context + candidates + pick"] = _time_stage(route, n, repeats)

        def bookkeeping(i: int) -> None:
            t = router._load.begin("w0", 100, hashes[i], 2)
            index.predict("w0", hashes[i], ttl=120.0, now=1.0)
            router._load.prefill_done(t)
            router._load.end(t)

        extra["after pick: load ticket + index.predict"] = _time_stage(bookkeeping, n, repeats)
    except Exception as exc:
        errors["router"] = f"Router path raised {type(exc).__name__}: {exc}"
    return {
        "machine": machine_info(), "tokenizer": str(tok), "requests": n, "repeats": repeats,
        "prompt_tokens": {"min": min(map(len, ids)), "max": max(map(len, ids)),
                          "mean": sum(map(len, ids)) / n},
        "blocks_per_prompt": sum(map(len, hashes)) / n,
        "mean_best_overlap_blocks": sum(max(f.values(), default=0) for f in found) / n,
        "mean_workers_with_overlap": sum(len(f) for f in found) / n,
        "index": index_info, "stages": stages, "budget_sum_us": budget_sum, "budget_us": BUDGET_US,
        "extra": extra, "errors": errors,
    }


def print_report(res: dict[str, Any]) -> None:
    pt = res["prompt_tokens"]
    print(f"kv-aware routing path in process: {pt['mean']:.0f}-token chat prompts ({res['blocks_per_prompt']:.0f} "
          f"blocks), index {res['index']['workers']} workers x ~{BLOCKS_PER_WORKER} blocks, mean best overlap "
          f"{res['mean_best_overlap_blocks']:.0f} blocks on {res['mean_workers_with_overlap']:.1f} workers")
    print(f"{'stage':<48}{'CPU µs/req':>16}{'min':>8}{'share':>8}{'wall µs':>9}")
    total = res["budget_sum_us"]
    for name, s in res["stages"].items():
        print(f"{name:<48}{s['median_us']:>16.1f}{s['min_us']:>8.1f}{s['median_us'] / total:>8.0%}"
              f"{s.get('wall_median_us', float('nan')):>9.1f}")
    verdict = "met" if total < res["budget_us"] and not res["errors"] else "NOT met"
    print(f"{'sum (render+tokenize+hash+query+score)':<48}{total:>16.1f}{'':>8}{'':>8}   "
          f"budget {res['budget_us']:.0f} µs: {verdict}")
    for name, s in res["extra"].items():
        print(f"{'  (not in budget) ' + name:<48}{s['median_us']:>16.1f}{s['min_us']:>8.1f}{'':>8}"
              f"{s['wall_median_us']:>9.1f}")
    for stage, err in res["errors"].items():
        print(f"ERROR in {stage}: {err}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--no-sweep", action="store_true", help="skip the prompt length / turn sweep")
    ap.add_argument("--baseline", default="80628ba", help="git ref whose infera/ is the sweep's 'before'")
    args = ap.parse_args()
    tok = args.tokenizer or default_tokenizer_dir()
    res = run(tok, quick=args.quick)
    print_report(res)
    if not args.no_sweep:
        from bench import prompt_sweep
        from infera.kv.tokenizer import PromptRenderer

        sweep = prompt_sweep.run(PromptRenderer.from_dir(tok), quick=args.quick)
        res["prompt_sweep"] = prompt_sweep.merge(sweep, prompt_sweep.baseline(args.baseline, tok, args.quick))
        prompt_sweep.print_report(res["prompt_sweep"])
        print(f"plot: {prompt_sweep.plot(res['prompt_sweep'])}")
    print(f"results: {write_results('routing_cpu', res)}")


if __name__ == "__main__":
    main()
