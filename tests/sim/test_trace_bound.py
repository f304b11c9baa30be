"""bench/trace_bound.py: the TTFT floor on a Mooncake trace counts the same hits as the simulator's limits."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.trace_bound import STEP_TOKENS, alone_ms, bounds, floor_ms
from infera.engine.mock.timing import StepTimeModel
from infera.sim.metrics import limits
from infera.sim.trace import TRACE_BLOCK, load_mooncake


def _trace(path: Path, n: int = 60, seed: int = 3) -> None:
    """Conversations that grow (a session's next prompt extends its last), a shared first block, odd lengths, long
    replies (their blocks crowd the small LRU, as in the simulator)."""
    rng = random.Random(seed)
    sessions: list[list[int]] = []
    next_id = 1
    with path.open("w") as f:
        for i in range(n):
            if sessions and rng.random() < 0.5:
                ids = rng.choice(sessions)
            else:
                ids = [0]
                sessions.append(ids)
            grow = rng.randint(1, 4)
            ids.extend(range(next_id, next_id + grow))
            next_id += grow
            length = (len(ids) - 1) * TRACE_BLOCK + rng.randint(1, TRACE_BLOCK)
            f.write(json.dumps({"timestamp": i * 100, "input_length": length, "output_length": rng.randint(1, 3000),
                                "hash_ids": list(ids)}) + "\n")


def test_the_bounds_hits_are_the_simulators_limits(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    _trace(path)
    capacity = 16
    b = bounds(path, capacity)
    lim = limits(load_mooncake(path, scale=1), TRACE_BLOCK, capacity)
    prompt = sum(b["prompt"])
    assert abs(sum(b["hit_infinite"]) / prompt - lim["infinite"]) < 1e-12
    assert abs(sum(b["hit_capacity"]) / prompt - lim["capacity"]) < 1e-12
    assert lim["capacity"] < lim["infinite"]  # the small cache evicts something: the two are told apart


def test_the_floor_is_never_above_what_the_engine_takes_alone() -> None:
    timing = StepTimeModel()
    for tokens in (1, 511, STEP_TOKENS, STEP_TOKENS + 1, 9000, 3 * STEP_TOKENS + 17, 40000):
        assert floor_ms(tokens, timing) <= alone_ms(tokens, timing) + 1e-9
    # a last chunk of 808 tokens: two equal chunks are faster than the engine's greedy 8,192 + 808
    assert floor_ms(9000, timing) < alone_ms(9000, timing) - 5.0
