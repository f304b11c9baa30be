"""Load generation and engine sampling for the routing-quality benchmark.

``run_cell`` plays one workload (sessions with start times, think times and a concurrency cap) against
one router URL with streaming chat requests, records TTFT (first body chunk), end-to-end time and the
usage of each response, and meanwhile samples every engine's ``/metrics`` for its in-flight requests
(running + waiting). ``engine_counters`` reads the engines' vLLM-named prefix-cache counters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import orjson

from bench.workloads import Workload

SAMPLE_EVERY = 0.25  # seconds between in-flight samples of every engine
COUNTERS = {"vllm:prefix_cache_queries_total": "queries", "vllm:prefix_cache_hits_total": "hits",
            "vllm:generation_tokens_total": "gen_tokens", "vllm:prompt_tokens_total": "prompt_tokens",
            "vllm:request_success_total": "requests", "vllm:num_preemptions_total": "preemptions"}
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


@dataclasses.dataclass
class Outcome:
    ttft: float
    e2e: float
    completion_tokens: int
    cached_tokens: int
    prompt_tokens: int


def parse_metrics(text: str) -> dict[str, float]:
    """Sums of the counters and gauges we read, over their label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = COUNTERS.get(name) or (name if name in GAUGES else None)
        if key is None:
            continue
        try:
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
    return out


async def _metrics(session: Any, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as resp:
        return parse_metrics(await resp.text())


async def engine_counters(session: Any, engines: Sequence[str]) -> list[dict[str, float]]:
    return list(await asyncio.gather(*(_metrics(session, e) for e in engines)))


async def reset_caches(session: Any, engines: Sequence[str]) -> list[bool]:
    async def one(url: str) -> bool:
        async with session.post(url + "/reset_prefix_cache") as resp:
            return bool(resp.status == 200 and (await resp.json()).get("success"))
    return list(await asyncio.gather(*(one(e) for e in engines)))


async def _send(session: Any, url: str, body: bytes) -> Outcome | str:
    t0 = time.perf_counter()
    first = 0.0
    tail = b""
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            async for chunk in resp.content.iter_any():
                if not first:
                    first = time.perf_counter()
                tail = (tail + chunk)[-4096:]
            t1 = time.perf_counter()
            if resp.status != 200:
                return f"{resp.status} {tail[:200]!r}"
    except Exception as exc:  # a failed request is counted, not fatal
        return repr(exc)
    if b"[DONE]" not in tail[-64:]:
        return f"stream ended without [DONE]: {tail[-200:]!r}"
    usage: dict[str, Any] = {}
    for line in tail.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage":{' in line:
            usage = orjson.loads(line[6:]).get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Outcome(first - t0, t1 - t0, int(usage.get("completion_tokens") or 0),
                   int(details.get("cached_tokens") or 0), int(usage.get("prompt_tokens") or 0))


WARM_REQUESTS = 16  # concurrent throwaway requests through a router before its cell (see warm_up)


async def warm_up(url: str, model: str, n: int = WARM_REQUESTS) -> int:
    """Send ``n`` short unrelated requests at once through ``url`` and wait for them (their errors count).

    The first cell after the engines (or a router) start paid for cold connections and first-use
    initialisation: live, the same router's burst TTFT p50 was 249 ms as the first cell and 126 ms
    as the second (bench/README.md, issue 14). Every cell is warmed the same way, then the engines'
    prefix caches are reset, so the warm-up leaves no cached block behind.
    """
    import aiohttp

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as session:
        bodies = [orjson.dumps({"model": model, "max_tokens": 4, "stream": True,
                                "messages": [{"role": "user", "content": f"warm-up {k}: say hello"}]})
                  for k in range(n)]
        got = await asyncio.gather(*(_send(session, url + "/v1/chat/completions", b) for b in bodies))
    return sum(1 for g in got if not isinstance(g, Outcome))


async def run_cell(url: str, w: Workload, model: str, engines: Sequence[str], time_limit: float) -> dict[str, Any]:
    """Play ``w`` against ``url``; return per-request outcomes, errors, in-flight samples, engine counters."""
    import aiohttp

    outcomes: list[Outcome] = []
    errors: list[str] = []
    samples: list[list[float]] = []
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=time_limit + 60)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, auto_decompress=False) as session:
        before = await engine_counters(session, engines)
        gate = asyncio.Semaphore(w.concurrency)
        started = time.perf_counter()
        deadline = started + time_limit
        done = asyncio.Event()

        async def play(s: int) -> None:
            delay = started + w.starts[s] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                for k, i in enumerate(w.sessions[s]):
                    if time.perf_counter() > deadline:
                        return
                    if k:
                        await asyncio.sleep(w.think[s])
                    res = await _send(session, url + "/v1/chat/completions", w.body(i, model))
                    if isinstance(res, Outcome):
                        outcomes.append(res)
                    else:
                        errors.append(res)

        async def sample() -> None:
            while not done.is_set():
                try:
                    got = await engine_counters(session, engines)
                    samples.append([g.get(GAUGES[0], 0.0) + g.get(GAUGES[1], 0.0) for g in got])
                except Exception:  # a slow scrape is skipped, not fatal
                    pass
                try:
                    await asyncio.wait_for(done.wait(), SAMPLE_EVERY)
                except TimeoutError:
                    pass

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(play(s) for s in range(len(w.sessions))))
        elapsed = time.perf_counter() - started
        done.set()
        await sampler
        after = await engine_counters(session, engines)
    delta = [{k: a.get(k, 0.0) - b.get(k, 0.0) for k in COUNTERS.values()} for a, b in zip(after, before, strict=True)]
    return {"outcomes": outcomes, "errors": errors, "elapsed": elapsed, "samples": samples, "engines": delta}
