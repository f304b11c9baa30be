"""What a run measured, and the limits no router could beat on the same requests.

Hit ratio is engine-counted, as vLLM counts it: the prefix-cache hit of each request at its
first schedule (``Sequence.cached_tokens``) over its prompt tokens. Two limits, both on full
blocks with the last prompt token never cached (as vLLM), fed every turn's prompt and then its
output (a reply's blocks are cached as it is generated), sessions in start order:

- ``infinite``: an unbounded cache -- the share of prompt tokens that repeat a prefix seen before;
- ``capacity``: one LRU cache as large as the whole fleet's KV blocks, so what a perfect router
  could keep if the fleet's memory were one pool (it ignores the blocks in-flight requests pin).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from infera.kv.hashing import block_hashes
from infera.sim.fleet import RunResult
from infera.sim.workload import Workload


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def limits(workload: Workload, block_size: int, capacity_blocks: int) -> dict[str, float]:
    seen: set[int] = set()
    lru: OrderedDict[int, None] = OrderedDict()
    total = inf_hit = cap_hit = 0
    for turn in workload.turns_in_order():
        prompt = turn.prompt
        hashes = block_hashes(prompt + turn.output, block_size)
        usable = (len(prompt) - 1) // block_size
        n = 0
        while n < usable and hashes[n] in seen:
            n += 1
        inf_hit += n * block_size
        n = 0
        while n < usable and hashes[n] in lru:
            n += 1
        cap_hit += n * block_size
        total += len(prompt)
        seen.update(hashes)
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return {"infinite": inf_hit / max(total, 1), "capacity": cap_hit / max(total, 1)}


def summarize(result: RunResult) -> dict[str, Any]:
    done = [r for r in result.requests if not r.rejected]
    ttft = [r.first_token - r.arrival for r in done]
    queue = [r.admitted - r.arrival for r in done]
    itl = [(r.finished - r.first_token) / (r.output_len - 1) for r in done if r.output_len > 1]
    prompt = sum(r.prompt_len for r in done)
    cached = sum(r.cached_tokens for r in done)
    end = max(result.end_time, 1e-9)
    served = [e.tokens_served for e in result.engines]
    running = [e.running_seconds / end for e in result.engines]
    busy = [e.busy_seconds / end for e in result.engines]
    mean_served = sum(served) / len(served)
    mean_running = sum(running) / len(running)
    routed_overlap = sum(r.overlap_blocks for r in done) * result.config.engine.block_size
    return {
        "policy": result.config.policy,
        "requests": len(result.requests),
        "rejected": len(result.requests) - len(done),
        "ttft_p50": percentile(ttft, 0.5),
        "ttft_p90": percentile(ttft, 0.9),
        "ttft_p99": percentile(ttft, 0.99),
        "itl_mean": sum(itl) / max(len(itl), 1),
        "itl_p90": percentile(itl, 0.9),
        "queue_p50": percentile(queue, 0.5),
        "queue_p90": percentile(queue, 0.9),
        "hit_ratio": cached / max(prompt, 1),
        "router_predicted_hit": routed_overlap / max(prompt, 1),
        "imbalance_tokens": max(served) / mean_served if mean_served else 0.0,
        "imbalance_running": max(running) / mean_running if mean_running else 0.0,
        "utilisation": sum(busy) / len(busy),  # mean share of the run each engine spent stepping
        "preemptions": sum(r.preemptions for r in done),
        "output_tokens_per_s": sum(r.output_len for r in done) / end,
        "virtual_seconds": result.end_time,
        "steps": sum(e.steps for e in result.engines),
        "decisions": dict(sorted(result.decisions.items())),
    }
