"""Issue 15, helper kvcpu2: a large chat prompt's context built off the loop whole (before) vs split (after).

Before: ``asyncio.to_thread(ContextBuilder.build)`` for every body over ``OFF_LOOP_BYTES``. After:
``ContextBuilder.build_off_loop`` (render here, tokenize in a thread only what the prompt cache lacks).
Conversations of bench/prompt_sweep.py grown to 64-512 KiB bodies; per size, 8 sessions: "warm" =
each session's next turn after the router saw its previous one (the prompt cache holds all but the
new turn), "cold" = a new session of the same size. CPU = this process's (all threads) per request,
median of 5 interleaved rounds (heap frozen, as the server's); loop stall = how late a 2 ms timer
on the same loop fired (max over the rounds), i.e. what another client's request would wait.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/offloop_ab.py
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench.conversations import chat_body_from
from bench.prompt_sweep import _session
from infera.kv.tokenizer import PromptRenderer
from infera.router.context import ContextBuilder, RouteRequest
from infera.router.router import OFF_LOOP_BYTES

TICK = 0.002
SIZES = (64 << 10, 128 << 10, 200 << 10, 512 << 10)  # 512 KiB: the same path both ways (the noise floor)
ROUNDS = 5


def _turns(target: int) -> int:
    lo, hi = 1, 2
    while len(chat_body_from(_session(0, hi), "m", False, 8)) < target:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if len(chat_body_from(_session(0, mid), "m", False, 8)) < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _req(session: int, turn: int) -> RouteRequest:
    body = chat_body_from(_session(session, turn), "m", False, 8)
    return RouteRequest("chat", "/v1/chat/completions", body, json.loads(body), "m")


async def _run(cb: ContextBuilder, mode: str, reqs: list[RouteRequest]) -> tuple[float, float]:
    late: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            late.append(now - last - TICK)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    c0 = time.process_time()
    for rq in reqs:
        if mode == "before":
            await asyncio.to_thread(cb.build, rq)
        else:
            await cb.build_off_loop(rq, OFF_LOOP_BYTES)
        await asyncio.sleep(0)
    cpu = (time.process_time() - c0) / len(reqs) * 1e6
    done = True
    await task
    return cpu, max(late) * 1e3


TOKENIZER = Path(__file__).resolve().parent.parent / ".cache" / "qwen-tokenizer"


async def main() -> None:
    renderer = PromptRenderer.from_dir(TOKENIZER)
    cache = renderer.prompt_cache
    assert cache is not None
    cb = ContextBuilder(renderer, True)
    gc.collect()
    gc.freeze()  # as the server does after start-up: a full collection of the tokenizer's tables is ~250 ms
    print(f"{'body':>8} {'case':>5} | {'CPU µs/req before':>17} {'after':>7} {'after/before':>12} | "
          f"{'max loop stall ms before':>24} {'after':>6}")
    for size in SIZES:
        t = _turns(size)
        warm = [_req(s, t) for s in range(8)]
        cases = {"warm": [_req(s, t + 1) for s in range(8)], "cold": [_req(100 + s, t + 1) for s in range(8)]}
        out: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for rnd in range(ROUNDS):
            for mode in ("before", "after") if rnd % 2 == 0 else ("after", "before"):
                for case, reqs in cases.items():
                    cache.clear()
                    if case == "warm":
                        for rq in warm:
                            cb.build(rq)
                    out.setdefault((mode, case), []).append(await _run(cb, mode, reqs))
        for case in cases:
            b = statistics.median(x[0] for x in out[("before", case)])
            a = statistics.median(x[0] for x in out[("after", case)])
            sb = max(x[1] for x in out[("before", case)])
            sa = max(x[1] for x in out[("after", case)])
            print(f"{size >> 10:>5} KiB {case:>5} | {b:>17.0f} {a:>7.0f} {a / b:>11.2f}x | {sb:>24.1f} {sa:>6.1f}",
                  flush=True)


if __name__ == "__main__":
    uvloop.run(main())
