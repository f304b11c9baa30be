"""Can any placement reach TTFT <= 0.5x round-robin's on the live bench's workloads? (issue 14)

Replays the live bench's own requests (bench/workloads.py, ``--quick``, rendered with the same chat
template and tokenizer, the same arrival times, think times, slots and KV blocks per engine as
bench/routing_quality.py gives them) in the fleet simulator (``infera.sim``: the router's policies over
the mock engine's scheduler, cache and timing, virtual time, no router or HTTP CPU), once per policy,
and beside them a bound no placement can beat:

``oracle-alone``: every request alone on an idle engine that holds every block any earlier request
had (the infinite-cache limit): its TTFT is its uncached tokens' prefill steps and nothing else (no
queue, no decoding batch sharing its steps). It ignores contention, so it is a bound, not a placement.

``--split``: where each policy's TTFT goes, per request (means and the p50 / p90 of each part): ``own``, its
uncached tokens' prefill steps alone (what it would take on an idle engine with the cache the run gave it),
``queue``, the wait before its first step (arrival to first schedule), and ``shared``, the rest (its steps also
computing other prompts' chunks and the decode batch). At the hit limit ``own`` is the oracle bound; what
placement can still move is ``queue`` and ``shared``, the contention of the load.

The mock's outputs are not in the next turn's prompt live (the histories carry synthetic replies),
so here each output is fresh token ids too. ``--max-tokens`` as the live bench (32).

    .venv/bin/python bench/oracle_ttft.py --workloads tenants,multiturn,agentic,burst
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workloads as live
from bench.common import default_tokenizer_dir
from infera.engine.mock.timing import StepTimeModel
from infera.kv.hashing import block_hashes
from infera.router.policies import POLICIES
from infera.sim.engine import EngineConfig
from infera.sim.fleet import FleetConfig, Simulation
from infera.sim.metrics import percentile, summarize
from infera.sim.workload import Session, Turn, Workload

FIT = 0.7  # bench/routing_quality.py's share of the hot set one engine holds
STEP_TOKENS = 8192


def to_sim(w: live.Workload, ids: list[list[int]], max_tokens: int, seed: int = 0) -> Workload:
    """The live workload as simulator sessions: same prompts (token ids), starts, thinks and slots."""
    rng = random.Random(seed)
    fresh = 1 << 20  # output ids no prompt contains

    def output() -> list[int]:
        return [fresh + rng.randrange(1 << 20) for _ in range(max_tokens)]

    sessions = [Session(w.starts[s], [Turn(ids[i], output()) for i in req], w.think[s])
                for s, req in enumerate(w.sessions)]
    return Workload(w.name, w.label, sessions, concurrency=w.concurrency if w.concurrency < len(sessions) else 0,
                    params=w.params)


def oracle_alone(w: Workload, block: int, timing: StepTimeModel) -> list[float]:
    """Per request (turns in start order): its TTFT alone on an idle engine with an infinite cache."""
    seen: set[int] = set()
    out = []
    for turn in w.turns_in_order():
        hashes = block_hashes(turn.prompt + turn.output, block)
        usable = (len(turn.prompt) - 1) // block
        n = 0
        while n < usable and hashes[n] in seen:
            n += 1
        seen.update(hashes)
        todo = len(turn.prompt) - n * block
        ms = 0.0
        while todo > 0:
            step = min(todo, STEP_TOKENS)
            ms += timing.prefill_ms(step)
            todo -= step
        out.append(ms / 1000.0 / timing.speedup_ratio)
    return out


def split(result: Any, timing: StepTimeModel) -> dict[str, list[float]]:
    """Per request (ms): own (its uncached prefill steps alone), queue (arrival to first schedule), shared (the
    rest of its TTFT: the steps it was computed in also computed other prompts and the decode batch)."""
    parts: dict[str, list[float]] = {"own": [], "queue": [], "shared": [], "ttft": []}
    for r in result.requests:
        if r.rejected:
            continue
        todo, own = r.prompt_len - r.cached_tokens, 0.0
        while todo > 0:
            step = min(todo, STEP_TOKENS)
            own += timing.prefill_ms(step)
            todo -= step
        own /= timing.speedup_ratio
        ttft = (r.first_token - r.arrival) * 1000.0
        queue = (r.admitted - r.arrival) * 1000.0
        parts["own"].append(own)
        parts["queue"].append(queue)
        parts["shared"].append(ttft - queue - own)
        parts["ttft"].append(ttft)
    # at each arrival, how many engines were decoding (some request past its first token, not finished): with
    # every engine decoding, any placement computes the prompt in a step that also decodes a batch
    done = [r for r in result.requests if not r.rejected]
    engines = {r.worker for r in done}
    parts["all_decoding"] = [float(len({o.worker for o in done if o.first_token <= r.arrival < o.finished})
                                   == len(engines)) for r in done]
    return parts


def live_workloads(names: list[str], max_tokens: int = 32, rate: float = 20.0,
                   quick: bool = True) -> list[tuple[Workload, int, float]]:
    """The live bench's workloads named, as simulator workloads, with each one's KV blocks per engine
    (as bench/routing_quality.py sizes them) and its infinite-cache limit."""
    from infera.kv.tokenizer import PromptRenderer

    renderer = PromptRenderer.from_dir(default_tokenizer_dir())
    out = []
    for lw in live.build(quick, max_tokens, rate):
        if lw.name not in names:
            continue
        ids = [renderer.chat_token_ids(m) for m in lw.messages]
        lim = live.hit_limit(lw, ids)
        blocks = max(int(FIT * live.hot_blocks(lw, ids, lim["reused_blocks"])), 256)
        out.append((to_sim(lw, ids, max_tokens), blocks, lim["limit"]))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="tenants,multiturn,agentic,burst")
    ap.add_argument("--policies", default="round-robin,kv-aware,approx-prefix")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--full", action="store_true", help="the full workloads, not --quick's")
    ap.add_argument("--seeds", type=int, default=1,
                    help="also run the router's tie-break seeds 1..N-1 and print each policy's p50 / p90 vs round-robin"
                         " per seed (closed loops of equal requests phase-lock: bench/README.md, helper unique)")
    ap.add_argument("--split", action="store_true", help="split each policy's TTFT: own prefill, queue, shared steps")
    args = ap.parse_args(argv)
    timing = StepTimeModel()
    if any(p not in POLICIES for p in args.policies.split(",")):
        from bench.cost_sweep import _variants

        _variants()  # the candidate costs under study (kv-aware-q1, ...)
    result: dict[str, Any] = {}
    for w, blocks, limit in live_workloads(args.workloads.split(","), args.max_tokens, args.rate, not args.full):
        engine = EngineConfig(num_blocks=blocks, block_size=live.BLOCK, timing=timing)
        alone = oracle_alone(w, live.BLOCK, timing)
        rows = {"oracle-alone": {"ttft_p50": percentile(alone, 0.5), "ttft_p90": percentile(alone, 0.9),
                                 "hit_ratio": limit}}
        splits = {}
        for p in args.policies.split(","):
            run = Simulation(w, FleetConfig(workers=args.engines, engine=engine, policy=p)).run()
            rows[p] = summarize(run)
            if args.split:
                splits[p] = split(run, timing)
        rr = rows.get("round-robin")
        print(f"{w.name}: {w.n_requests} requests, {blocks} blocks per engine, limit {limit:.3f}")
        for p, r in rows.items():
            ratio = (f"  p50/p90 vs rr {r['ttft_p50'] / rr['ttft_p50']:.2f} / {r['ttft_p90'] / rr['ttft_p90']:.2f}"
                     if rr else "")
            print(f"  {p:<16} TTFT p50 {r['ttft_p50'] * 1000:6.1f} ms  p90 {r['ttft_p90'] * 1000:6.1f} ms  "
                  f"hit {r['hit_ratio']:.3f}{ratio}")
        for p, parts in splits.items():
            every = sum(parts["all_decoding"]) / max(len(parts["all_decoding"]), 1)
            print(f"  {p:<16} split ms (mean, p50, p90): " + "; ".join(
                f"{k} {sum(v) / max(len(v), 1):.1f}, {percentile(v, 0.5):.1f}, {percentile(v, 0.9):.1f}"
                for k, v in parts.items() if k != "all_decoding")
                + f"; every engine decoding at arrival {every:.0%}"
                + f"; utilisation {rows[p]['utilisation']:.2f}")
        for p in args.policies.split(",") if args.seeds > 1 else ():
            ratios = []
            for seed in range(args.seeds):
                cfg = FleetConfig(workers=args.engines, engine=engine, policy=p, seed=seed)
                base = FleetConfig(workers=args.engines, engine=engine, policy="round-robin", seed=seed)
                r, b = summarize(Simulation(w, cfg).run()), summarize(Simulation(w, base).run())
                ratios.append(f"{r['ttft_p50'] / b['ttft_p50']:.2f}/{r['ttft_p90'] / b['ttft_p90']:.2f}")
            print(f"  {p:<16} p50/p90 vs rr, seeds 0..{args.seeds - 1}: {' '.join(ratios)}")
        result[w.name] = {"blocks": blocks, "limit": limit,
                           "rows": {p: {k: r[k] for k in ("ttft_p50", "ttft_p90", "hit_ratio")}
                                    for p, r in rows.items()}}
    return result


if __name__ == "__main__":
    main()
