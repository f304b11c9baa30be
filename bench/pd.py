"""Prefill/decode disaggregation against a mixed fleet, on one workload and the same number of engines.

Scenarios, each on fresh mock engines behind one kv-aware infera frontend:

  mixed     N mixed engines
  pd-pull   N/2 prefill + N/2 decode engines, vLLM NIXL-style serial pull
  pd-push   N/2 prefill + N/2 decode engines, SGLang-style concurrent push

The workload: streamed chat requests with ~1k-token prompts (``--prefixes`` distinct system
prompts, each reused, plus a unique user turn), ``--max-tokens`` output tokens each, a closed
loop of ``--concurrency`` clients. The mock's step-time model (Dynamo's published constants)
makes a prefill chunk stall every decode row of its step on a mixed engine, which is what
disaggregation removes; the decode engines pay ``--kv-transfer-ms-per-block`` per block instead.

Reported per scenario: TTFT p50/p90 (request start -> first streamed chunk), time per output
token p50/p90 (per request: (last chunk - first chunk) / (tokens - 1)), inter-token latency
p50/p99 (every gap between two streamed chunks, pooled: a prefill that stalls a decode batch
shows here), output tokens/s and requests/s. The load generator (aiohttp) is this process.

    .venv/bin/python bench/pd.py --quick   # ~1 minute
    .venv/bin/python bench/pd.py           # the README table
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Proc,
    chat_messages,
    default_tokenizer_dir,
    frontend,
    frontend_ready,
    machine_info,
    make_session,
    mock_engine,
    percentile,
    stop_all,
    write_results,
)

MODEL = "bench-model"
SCENARIOS = ("mixed", "pd-pull", "pd-push")


def roles(scenario: str, n: int) -> list[tuple[str, ...]]:
    if scenario == "mixed":
        return [() for _ in range(n)]
    connector = scenario.removeprefix("pd-")
    half = n // 2
    prefill: tuple[str, ...] = ("--role", "prefill", "--connector", connector)
    decode: tuple[str, ...] = ("--role", "decode", "--connector", connector)
    return [prefill] * half + [decode] * (n - half)


def bodies(n: int, prefixes: int, max_tokens: int) -> list[bytes]:
    out = []
    for i in range(n):
        payload: dict[str, Any] = {"model": MODEL, "messages": chat_messages(i, prefixes), "max_tokens": max_tokens,
                                   "temperature": 0.0, "stream": True}
        out.append(json.dumps(payload, separators=(",", ":")).encode())
    return out


async def drive(url: str, reqs: list[bytes], concurrency: int, max_tokens: int,
                time_limit: float) -> dict[str, Any]:
    ttfts: list[float] = []
    tpots: list[float] = []
    gaps: list[float] = []
    errors = 0
    first_error = ""
    next_i = 0
    clock = time.perf_counter
    started = clock()
    deadline = started + time_limit
    session = make_session(concurrency)

    async def client() -> None:
        nonlocal next_i, errors, first_error
        while next_i < len(reqs) and clock() < deadline:
            body = reqs[next_i]
            next_i += 1
            t0 = clock()
            first = last = 0.0
            tail = b""
            mine: list[float] = []
            try:
                async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
                    async for chunk in resp.content.iter_any():
                        now = clock()
                        if last:
                            mine.append(now - last)
                        last = now
                        first = first or last
                        tail = chunk
                    if resp.status != 200 or b"[DONE]" not in tail[-32:]:
                        errors += 1
                        first_error = first_error or f"{resp.status} {tail[:200]!r}"
                        continue
            except Exception as exc:
                errors += 1
                first_error = first_error or repr(exc)
                continue
            ttfts.append(first - t0)
            tpots.append((last - first) / max(1, max_tokens - 1))
            gaps.extend(mine)

    try:
        await asyncio.gather(*(client() for _ in range(concurrency)))
    finally:
        await session.close()
    elapsed = clock() - started
    ms = 1000.0
    return {
        "ok": len(ttfts), "errors": errors, "first_error": first_error, "elapsed_s": round(elapsed, 2),
        "ttft_p50_ms": round(percentile(ttfts, 50) * ms, 1), "ttft_p90_ms": round(percentile(ttfts, 90) * ms, 1),
        "tpot_p50_ms": round(percentile(tpots, 50) * ms, 2), "tpot_p90_ms": round(percentile(tpots, 90) * ms, 2),
        "itl_p50_ms": round(percentile(gaps, 50) * ms, 2), "itl_p99_ms": round(percentile(gaps, 99) * ms, 2),
        "tokens_per_s": round(len(ttfts) * max_tokens / elapsed, 1), "requests_per_s": round(len(ttfts) / elapsed, 2),
    }


def run_scenario(scenario: str, args: argparse.Namespace, tokenizer: Path, log_dir: Path,
                 reqs: list[bytes]) -> dict[str, Any]:
    engines: list[Proc] = []
    procs: list[Proc] = []
    try:
        common = ("--num-kv-blocks", str(args.kv_blocks), "--kv-transfer-ms-per-block", str(args.transfer_ms))
        for k, extra in enumerate(roles(scenario, args.engines)):
            engines.append(mock_engine(f"{scenario}-{k}", tokenizer, MODEL, log_dir, speedup=args.speedup,
                                       extra=(*common, *extra)).start())
        procs.extend(engines)
        for e in engines:
            e.wait_ready("/health", 120)
        front = frontend(f"{scenario}-frontend", tokenizer, "kv-aware", engines, log_dir).start()
        procs.append(front)
        front.wait_ready("/health", 120, frontend_ready(len(engines)))
        url = front.url + "/v1/chat/completions"
        asyncio.run(drive(url, reqs[: args.concurrency], args.concurrency, args.max_tokens, 60))  # warm up
        result = asyncio.run(drive(url, reqs, args.concurrency, args.max_tokens, args.time_limit))
        return {"scenario": scenario, **result}
    finally:
        stop_all(procs)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| fleet | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms | ITL p50 ms | ITL p99 ms "
            "| output tok/s | req/s | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [f"| {r['scenario']} | {r['ttft_p50_ms']} | {r['ttft_p90_ms']} | {r['tpot_p50_ms']} | {r['tpot_p90_ms']} "
             f"| {r['itl_p50_ms']} | {r['itl_p99_ms']} | {r['tokens_per_s']} | {r['requests_per_s']} | {r['errors']} |"
             for r in rows]
    return "\n".join([head, *lines])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=4, help="mock engines per fleet (PD: half prefill, half decode)")
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prefixes", type=int, default=64, help="distinct system prompts (each ~900 tokens)")
    ap.add_argument("--speedup", type=float, default=2.0, help="mock --speedup-ratio")
    ap.add_argument("--kv-blocks", type=int, default=4096)
    ap.add_argument("--transfer-ms", type=float, default=0.05, help="decode mock --kv-transfer-ms-per-block")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--quick", action="store_true", help="64 requests, concurrency 8")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.concurrency = 64, 8
    tokenizer = default_tokenizer_dir()
    reqs = bodies(args.requests, args.prefixes, args.max_tokens)
    info = machine_info()
    rows = []
    with tempfile.TemporaryDirectory(prefix="infera-bench-pd-") as tmp:
        for scenario in args.scenarios.split(","):
            row = run_scenario(scenario, args, tokenizer, Path(tmp), reqs)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(table(rows))
    path = write_results("pd", {"machine": info, "args": vars(args), "rows": rows})
    print(f"machine: {info}\nresults: {path}")


if __name__ == "__main__":
    main()
