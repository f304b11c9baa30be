"""The routing path per request in process, stage by stage: kv-aware vs round-robin, and a git ref vs this tree.

router_overhead.py's workload (~1k-token chat prompts: 16 shared system prompts + history, a unique user
turn each, ``max_tokens`` 8) through a real :class:`Router` over 2 workers with fakes at the transport: per
request the stages of ``Router._place`` (topology + pool, context = render + tokenize through the prompt
cache, block hashes, pick = the policy's score, legs = load ticket + the index's prediction), the first token
and the end of the request, and then the KV events the engine would publish for it (``BlockStored`` of the
blocks it lacked, and the LRU's ``BlockRemoved`` with ``--kv-blocks``) as the frontend takes them: encoded
(untimed), then ``deliver`` from their bytes into the index feed (decode + apply, or ``apply_payload`` where
the tree has it; until issue 15's eleventh round this stage applied pre-built batches and timed the engine's
LRU with them, so its figures before then are not comparable). CPU time of this process (``process_time``),
µs per request, after a warm-up; the caller's ``gc`` settings as the server's (frozen heap, young threshold
5000). The last column, ``gc``, is the part of the total the cyclic GC's collections took (timed by a
``gc.callbacks`` hook; a collection runs inside whichever stage allocated, mostly the context stage).

    .venv/bin/python bench/kv_stages.py                  # kv-aware and round-robin, this tree
    .venv/bin/python bench/kv_stages.py --ref main       # and the same at git ref main, interleaved rounds
    .venv/bin/python bench/kv_stages.py --ref main --score-ab   # the kv-aware score alone, main's vs this tree's,
                                                                # alternating decision by decision in one process
    .venv/bin/python bench/kv_stages.py --ref main --workload tenants   # routing_quality's ~2.7k-token tenants
                                                                # prompts (or multiturn), played as a frontend
                                                                # started for them takes them
    .venv/bin/python bench/kv_stages.py --ref main --virtual-clock ...  # the router's clock virtual: both trees make
                                                                # the same decisions (an A/B of a change keeping them)
    .venv/bin/python bench/kv_stages.py --ref main --thrash 16 ...  # 16 MB copied between requests (untimed): the
                                                                # caches as a live frontend's, the stages' µs ~live's
    .venv/bin/python bench/kv_stages.py --kv-blocks 1000 ...    # small caches: the workers fill and evict (their
                                                                # LRU's BlockRemoved applied too), so kv-aware's
                                                                # eviction term and its recency shadow's value run
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STAGES = ("topology+pool", "context", "hashes", "pick", "legs", "first token", "end", "events apply")
GC = "gc"  # within the stages, not added to the total


def workload_bodies(workload: str) -> tuple[list[bytes], int, int, int]:
    """The request bodies a run cycles through, every how many requests the prompt cache starts cold again, the
    workers and the answers' max_tokens.

    ``chats``: router_overhead.py's 4096 chats over 2 workers (the prompt cache never cleared). ``tenants`` /
    ``multiturn``: routing_quality's ``--quick`` workload of that name (bench/workloads.py; ``tenants``: 16
    tenants' ~1.9k-token system prompts and a unique question; ``multiturn``: conversations growing to ~2.7k
    tokens) over its 4 workers, in its nominal order, played as quality_cpu_split.py plays it to a frontend
    started for it: once with a cold prompt cache (the first turns and each tenant's system prompt encoded whole)
    and once more with every prompt seen (its ``whole`` variant), then the cache cleared and again."""
    from bench import workloads
    from bench.common import chat_body

    if workload in ("chats", "chat"):
        return [chat_body(i, "m", False, 8) for i in range(4096)], 0, 2, 8
    made = {w.name: w for w in (workloads.tenants(16, 240, 20.0, 32), workloads.multiturn(12, 24, 5, 32))}
    if workload not in made:
        raise SystemExit(f"unknown workload {workload!r} (chats, tenants, multiturn)")
    w = made[workload]
    bodies = [w.body(i, "m") for i in workloads.nominal_order(w)]
    return bodies, 2 * len(bodies), 4, w.max_tokens


def run_stages(policy: str, n: int, warmup: int, kv_blocks: int = 100000,
               workload: str = "chats", virtual_clock: bool = False, thrash_mb: float = 0.0) -> dict[str, float]:
    from collections import OrderedDict

    import orjson

    from bench.common import default_tokenizer_dir
    from infera.kv.tokenizer import PromptRenderer
    from infera.protocols.kv_events import BlockRemoved, BlockStored, EventBatch, encode_batch
    from infera.protocols.worker import Capacity
    from infera.router.context import RouteRequest
    from infera.router.router import Router, RouterOptions
    from infera.transport.delivery import deliver
    from tests.fakes import FakeFleet, FakeTransport, worker

    renderer = PromptRenderer.from_dir(default_tokenizer_dir())
    bodies, cold_every, n_workers, max_tokens = workload_bodies(workload)
    payloads = [orjson.loads(b) for b in bodies]
    fleet = FakeFleet(*[worker(f"w{k}", model="m", kv_block_size=16, capacity=Capacity(kv_blocks=kv_blocks))
                        for k in range(n_workers)])
    # --virtual-clock: the router's clock moves 100 µs a reading, not with the run's own pace, so two trees that decide
    # alike make the same decisions (the predictions' expiry, and with it the index's remembered runs, otherwise follow
    # each run's speed: a slower run expires more); the stages are still timed on the process's CPU clock
    ticks = itertools.count(1)
    router = Router(fleet, FakeTransport(), None, renderer, RouterOptions(policy=policy), rng=random.Random(1),
                    **({"clock": lambda: 1000.0 + next(ticks) * 1e-4} if virtual_clock else {}))
    cands, ctxs, picker, legs, load, index = (router._candidates, router._context, router._picker, router._legs,
                                              router._load, router._feed.index)
    feed = router._feed
    # the feed's raw sink as the frontend binds it (a tree before it has none; its deliver takes four arguments)
    raw = feed.on_payload if getattr(index, "takes_payloads", False) else None
    gc.freeze()
    gc.set_threshold(5000, 10, 10)
    total = dict.fromkeys(STAGES, 0)
    clock = time.process_time_ns
    collecting = [0, 0, False]  # start of the running collection, ns spent in measured collections, measuring

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting[0] = time.thread_time_ns()
        elif collecting[2]:
            collecting[1] += time.thread_time_ns() - collecting[0]

    gc.callbacks.append(on_gc)
    mask = (1 << 48) - 1  # engine hashes: opaque ids, not the router's
    engines: dict[str, OrderedDict[int, None]] = {}  # per worker, its engine's LRU of stored blocks (--kv-blocks)
    prompts = renderer.prompt_cache
    # --thrash: a copy of this many MB between requests (untimed) leaves the caches as a live frontend's work between
    # two decisions does (its HTTP, JSON, tokenizer and event intake): a decision's lines then wait on memory as live
    scratch = bytearray(int(thrash_mb * (1 << 20)))
    for i in range(warmup + n):
        if scratch:
            bytes(scratch)
        collecting[2] = i >= warmup
        if cold_every and i % cold_every == 0 and prompts is not None:
            prompts.clear()  # a frontend started for the workload (untimed)
        req = RouteRequest(kind="chat", path="/v1/chat/completions", body=bodies[i % len(bodies)],
                           payload=payloads[i % len(bodies)], model="m", max_tokens=max_tokens)
        t0 = clock()
        cands.topology("m", "chat")
        pool = cands.pool("m", "mixed", "chat")
        t1 = clock()
        ctx = ctxs.build(req)
        t2 = clock()
        hashes = ctx.hashes(16) if ctx.token_ids else []
        t3 = clock()
        choice = picker.pick(ctx, pool, router._policy, policy)
        t4 = clock()
        placed = legs.place("mixed", {"mixed": choice.worker}, None, ctx, choice.overlap, frozenset(), 1, [])
        t5 = clock()
        placed.answered()
        load.prefill_done(placed.tickets["mixed"])
        t6 = clock()
        placed.release()
        t7 = clock()
        t7e = clock()
        if hashes and choice.overlap < len(hashes):
            ids, k = ctx.token_ids or [], choice.overlap
            wid = choice.worker.instance_id
            stored = [h & mask for h in hashes[k:]]
            sent = [encode_batch(EventBatch(ts=0.0, events=[BlockStored(
                block_hashes=stored, parent_block_hash=hashes[k - 1] & mask if k else None,
                token_ids=list(ids[k * 16: len(hashes) * 16]), block_size=16)]))]
            lru = engines.setdefault(wid, OrderedDict())
            for h in hashes:  # the engine's LRU: the prompt's blocks are the youngest
                lru[h & mask] = None
                lru.move_to_end(h & mask)
            if len(lru) > kv_blocks:
                gone = [lru.popitem(last=False)[0] for _ in range(len(lru) - kv_blocks)]
                sent.append(encode_batch(EventBatch(ts=0.0, events=[BlockRemoved(block_hashes=gone)])))
            t7e = clock()  # the engine's work (its LRU, the encoding) is not the router's
            for payload in sent:  # what the frontend's event reader does with each batch's bytes
                if raw is None:
                    deliver(wid, payload, feed.on_batch, feed.on_gap)
                else:
                    deliver(wid, payload, feed.on_batch, feed.on_gap, raw)
        t8 = clock()
        if i >= warmup:
            for stage, d in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t8 - t7e),
                                strict=True):
                total[stage] += d
    gc.callbacks.remove(on_gc)
    return {**{stage: v / n / 1e3 for stage, v in total.items()}, GC: collecting[1] / n / 1e3}


def score_ab(ref: str, n: int, warmup: int, kv_blocks: int = 100000, workload: str = "chats") -> dict[str, Any]:
    """kv-aware's whole score (``KvEvictPolicy.score``: the recency shadow's touch, the terms, the speed scale) of
    git ``ref``'s kv_evict.py and kv_ttft.py against this tree's, decision by decision on run_stages' router (the
    same index, load and candidates; the order alternating; both policies see the same clock reading per decision,
    and each keeps its own shadow), with the cost compared: wall ns per call (gc as the server's), medians over
    the decisions, how many decisions' costs differed (to the bit) and how many picked another worker. Where this tree
    scores the worker records (``score_workers``), each side's time includes its candidates as its Picker builds
    them (the ref's Candidate objects; none here)."""
    import importlib.util

    from infera.router import kv_evict
    from infera.router.base import Candidate, PolicyDeps

    repo = Path(__file__).resolve().parent.parent

    def load(path: str, name: str, swap: tuple[str, str] | None = None) -> Any:
        source = subprocess.run(["git", "-C", str(repo), "show", f"{ref}:{path}"], check=True,
                                capture_output=True).stdout
        if swap is not None:
            source = source.replace(swap[0].encode(), swap[1].encode())
        with tempfile.NamedTemporaryFile("wb", suffix=".py", delete=False) as f:
            f.write(source)
        spec = importlib.util.spec_from_file_location(name, f.name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        Path(f.name).unlink()
        return module

    load("infera/router/kv_ttft.py", "ref_kv_ttft")
    module = load("infera/router/kv_evict.py", "ref_kv_evict",
                  ("from infera.router.kv_ttft import", "from ref_kv_ttft import"))
    times: dict[str, list[int]] = {ref: [], "this tree": []}
    refs: dict[int, Any] = {}
    differ = [0, 0]  # costs, picks
    ours = kv_evict.KvEvictPolicy.score
    frozen = [0.0]

    # where this tree's Picker hands kv-aware the worker records (score_workers, issue 15's twelfth round), both sides
    # time what their Picker runs: the ref builds the candidates (Picker._candidates) and scores them, this tree
    # makes its one call (or, where that answers None, the same as the ref)
    fast = getattr(kv_evict.KvEvictPolicy, "score_workers", None)

    def candidates(tracker: Any, workers: Any) -> list[Any]:
        return [Candidate(w, tracker.in_flight(w.instance_id), tracker.prefill_tokens(w.instance_id),
                          tracker.active_blocks(w.instance_id)) for w in workers]

    def ours_workers(self: Any, ctx: Any, workers: Any, tracker: Any) -> Any:
        got = fast(self, ctx, workers, tracker)
        return got if got is not None else ours(self, ctx, candidates(tracker, workers))

    def both_workers(self: Any, ctx: Any, workers: Any, tracker: Any) -> Any:
        return both(self, ctx, (workers, tracker))

    def both(self: Any, ctx: Any, cands: Any) -> Any:  # the workers' form passes (workers, load)
        other = refs.get(id(self))
        if other is None:
            clock = self._clock
            self._clock = lambda: frozen[0]
            other = refs[id(self)] = module.KvEvictPolicy(PolicyDeps(self._index, self._weight, lambda w: False,
                                                                     self._load, lambda: frozen[0]))
            other._real_clock = clock
            if fast is not None:
                self._decide_cfg = None  # built again with the frozen clock
        frozen[0] = other._real_clock()
        out = {}
        for name in (ref, "this tree") if len(times[ref]) % 2 else ("this tree", ref):
            t = time.perf_counter_ns()
            if type(cands) is tuple:
                workers, tracker = cands
                out[name] = ours_workers(self, ctx, workers, tracker) if name == "this tree" else \
                    other.score(ctx, candidates(tracker, workers))
            else:
                out[name] = ours(self, ctx, cands) if name == "this tree" else other.score(ctx, cands)
            times[name].append(time.perf_counter_ns() - t)
        a, b = out[ref].costs, out["this tree"].costs
        differ[0] += a != b
        differ[1] += min(range(len(a)), key=a.__getitem__) != min(range(len(b)), key=b.__getitem__)
        return out["this tree"]

    kv_evict.KvEvictPolicy.score = both  # type: ignore[method-assign]
    if fast is not None:
        kv_evict.KvEvictPolicy.score_workers = both_workers  # type: ignore[method-assign]
    try:
        run_stages("kv-aware", n, warmup, kv_blocks, workload)
    finally:
        kv_evict.KvEvictPolicy.score = ours  # type: ignore[method-assign]
        if fast is not None:
            kv_evict.KvEvictPolicy.score_workers = fast  # type: ignore[method-assign]
    med = {name: statistics.median(v) / 1e3 for name, v in times.items()}
    return {"decisions": len(times[ref]), "costs differ": differ[0], "picks differ": differ[1],
            **{f"{k} µs": v for k, v in med.items()}, "ratio": med["this tree"] / med[ref]}


def _child(root: str, policy: str, n: int, warmup: int, kv_blocks: int, workload: str,
           virtual_clock: bool = False, thrash_mb: float = 0.0) -> dict[str, float]:
    """This file's run_stages in a fresh process with ``root``'s infera (and bench helpers) first on the path."""
    repo = str(Path(__file__).resolve().parent.parent)
    here = str(Path(__file__).resolve())
    code = (f"import sys, json, importlib.util as u; sys.path.insert(0, {root!r}); sys.path.insert(1, {repo!r}); "
            f"s = u.spec_from_file_location('kv_stages_here', {here!r}); k = u.module_from_spec(s); "
            f"s.loader.exec_module(k); "
            f"print(json.dumps(k.run_stages({policy!r}, {n}, {warmup}, {kv_blocks}, {workload!r}, {virtual_clock!r}, "
            f"{thrash_mb!r})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="", help="git ref to compare with (its infera/, this tree's C extension)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--kv-blocks", type=int, default=100000,
                    help="each worker's KV capacity in blocks (small: the caches fill, the engines evict)")
    ap.add_argument("--workload", default="chats", choices=("chats", "chat", "tenants", "multiturn"),
                    help="chats (router_overhead's ~1k-token chats, 2 workers), or routing_quality's tenants or "
                         "multiturn (2-3k-token prompts, 4 workers, 16-token blocks): --n and --warmup are then "
                         "rounded up to whole plays of it (cold prompt cache, then every prompt seen)")
    ap.add_argument("--virtual-clock", action="store_true",
                    help="the router's clock moves 100 µs a reading: two trees that decide alike decide the same")
    ap.add_argument("--thrash", type=float, default=0.0, metavar="MB",
                    help="copy this many MB between requests (untimed): the caches as live (16: ~live's µs)")
    ap.add_argument("--score-ab", action="store_true",
                    help="instead: the kv-aware policy's score at --ref against this tree's, decision by decision")
    args = ap.parse_args()
    _, cycle, _, _ = workload_bodies(args.workload)
    if cycle:
        args.n, args.warmup = (-(-x // cycle) * cycle for x in (args.n, args.warmup))
    if args.score_ab:
        for r in range(args.rounds):
            found = score_ab(args.ref or "main", args.n, args.warmup, args.kv_blocks, args.workload)
            print(f"round {r}: {json.dumps(found, ensure_ascii=False)}", flush=True)
        return
    repo = Path(__file__).resolve().parent.parent
    trees = {"this tree": str(repo)}
    tmp = None
    if args.ref:
        from bench.common import export_ref

        tmp = export_ref(args.ref, Path(tempfile.mkdtemp(prefix="kv-stages-")))  # with its own C extensions
        trees = {args.ref: str(tmp), "this tree": str(repo)}
    cells = [(name, policy) for name in trees for policy in ("round-robin", "kv-aware")]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {c: [] for c in cells}
    try:
        for r in range(args.rounds):
            for name, policy in (cells if r % 2 == 0 else list(reversed(cells))):
                runs[(name, policy)].append(_child(trees[name], policy, args.n, args.warmup, args.kv_blocks,
                                                     args.workload, args.virtual_clock, args.thrash))
                last = runs[(name, policy)][-1]
                took = sum(last[s] for s in STAGES)
                print(f"round {r} {name} {policy}: {took:.0f} µs/req, gc {last.get(GC, 0.0):.1f}", flush=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n| tree | policy | " + " | ".join(STAGES) + " | total | of which gc |")
    print("|---|---|" + "--:|" * (len(STAGES) + 2))
    summary: dict[str, Any] = {}
    for name, policy in cells:
        med = {s: statistics.median(x[s] for x in runs[(name, policy)]) for s in STAGES}
        tot = statistics.median(sum(x[s] for s in STAGES) for x in runs[(name, policy)])
        collected = statistics.median(x.get(GC, 0.0) for x in runs[(name, policy)])  # a ref's copy may not time it
        summary[f"{name} {policy}"] = {**med, "total": tot, GC: collected}
        cells = " | ".join(f"{med[s]:.1f}" for s in STAGES)
        print(f"| {name} | {policy} | {cells} | **{tot:.0f}** | {collected:.1f} |")


if __name__ == "__main__":
    main()
