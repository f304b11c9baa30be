"""Mooncake-format traces: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

Each hash id stands for one 512-token block; two requests sharing the first k ids share the
first k*512 prompt tokens and the last id covers a partial block. The prompt is synthesized
by mapping every id to a fixed, seeded run of token ids (equal ids give equal tokens), after
scaling: ``scale`` divides the lengths and the 512-token block alike (``scale=8``: 64-token
trace blocks, prompts 1/8 as long), keeping the sharing structure. ``time_scale`` multiplies
the arrival times (0.5 = the same requests twice as fast). Outputs are unique per request.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from infera.sim.workload import Session, Turn, Workload

TRACE_BLOCK = 512
VOCAB_BITS = 17  # token ids below 131072: a Qwen-sized vocabulary
OUTPUT_BASE = 1 << VOCAB_BITS  # output ids live above the prompt ids, so no prompt ever equals an output


class BlockTokens:
    """Hash id -> its fixed run of token ids (computed once per id)."""

    def __init__(self, block: int, seed: int) -> None:
        self.block = block
        self.seed = seed
        self._runs: dict[int, list[int]] = {}

    def __call__(self, hash_id: int) -> list[int]:
        run = self._runs.get(hash_id)
        if run is None:
            bits = random.Random(self.seed * 1_000_003 + hash_id).getrandbits(VOCAB_BITS * self.block)
            mask = (1 << VOCAB_BITS) - 1
            run = [(bits >> (VOCAB_BITS * j)) & mask for j in range(self.block)]
            self._runs[hash_id] = run
        return run


def load_mooncake(path: str | Path, scale: int = 8, time_scale: float = 1.0, limit: int = 0,
                  seed: int = 0) -> Workload:
    if TRACE_BLOCK % scale:
        raise ValueError(f"scale must divide {TRACE_BLOCK}, got {scale}")
    block = TRACE_BLOCK // scale
    runs = BlockTokens(block, seed)
    sessions: list[Session] = []
    with open(path) as f:
        for i, line in enumerate(f):
            if limit and i >= limit:
                break
            rec = json.loads(line)
            n_in = max(1, -(-int(rec["input_length"]) // scale))
            n_out = max(1, -(-int(rec["output_length"]) // scale))
            prompt: list[int] = []
            for h in rec["hash_ids"]:
                prompt.extend(runs(int(h)))
            if len(prompt) < n_in:  # longer than its ids say: pad with tokens of its own
                prompt.extend(OUTPUT_BASE - 1 - (j % 1000) for j in range(n_in - len(prompt)))
            del prompt[n_in:]
            output = [OUTPUT_BASE + (i * 7919 + j) % (1 << 20) for j in range(n_out)]
            sessions.append(Session(start=float(rec["timestamp"]) / 1000.0 * time_scale,
                                    turns=[Turn(prompt, output)]))
    name = Path(path).stem
    return Workload(name, f"Mooncake {name} (lengths /{scale}, time x{time_scale:g})", sessions,
                    params={"path": str(path), "scale": scale, "trace_block_tokens": block,
                            "time_scale": time_scale, "limit": limit, "requests": len(sessions)})
