"""Upstream HTTP client choice: aiohttp (what infera.transport.http uses) against httpx.

One mock engine at a huge speedup; for each client a separate worker process sends the
same ~1k-token chat requests to it the way the router's transport does (a pooled client,
the body relayed chunk by chunk as it arrives) and reports its own CPU time per request
and the latency it saw. Workers of the two clients alternate round by round, so both see
the same machine noise; compare the ratios, not the absolute numbers.

    .venv/bin/python bench/http_client.py            # 3 rounds
    .venv/bin/python bench/http_client.py --quick    # 1 round, fewer requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    PYTHON,
    chat_body,
    default_tokenizer_dir,
    machine_info,
    median,
    mock_engine,
    percentile,
    stop_all,
    write_results,
)

CLIENTS = ("aiohttp", "httpx")
MODEL = "bench-model"
CELLS = [(False, 1), (True, 1), (False, 32), (True, 32)]  # (stream, concurrency)


# ---------------------------------------------------------------------------------------
# Worker: one process, one client library


Bodies = dict[bool, list[bytes]]


async def _aiohttp_cells(url: str, cells: list[dict[str, Any]], bodies: Bodies) -> list[dict[str, Any]]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60, enable_cleanup_closed=True)
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                                    auto_decompress=False, skip_auto_headers=("User-Agent",))

    async def one(body: bytes) -> tuple[float, bool]:
        t0 = time.perf_counter()
        resp = await session.post(url, data=body, headers={"content-type": "application/json"})
        try:
            n = 0
            async for chunk in resp.content.iter_any():
                n += len(chunk)
        finally:
            resp.release()
        return time.perf_counter() - t0, resp.status == 200 and n > 0

    try:
        return [await _run_cell(one, cell, bodies) for cell in cells]
    finally:
        await session.close()


async def _httpx_cells(url: str, cells: list[dict[str, Any]], bodies: Bodies) -> list[dict[str, Any]]:
    import httpx

    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=256,
                                                   keepalive_expiry=60),
                               timeout=httpx.Timeout(None, connect=5))

    async def one(body: bytes) -> tuple[float, bool]:
        t0 = time.perf_counter()
        req = client.build_request("POST", url, content=body, headers={"content-type": "application/json"})
        resp = await client.send(req, stream=True)
        try:
            n = 0
            async for chunk in resp.aiter_raw():
                n += len(chunk)
        finally:
            await resp.aclose()
        return time.perf_counter() - t0, resp.status_code == 200 and n > 0

    try:
        return [await _run_cell(one, cell, bodies) for cell in cells]
    finally:
        await client.aclose()


async def _run_cell(one: Any, cell: dict[str, Any], bodies: dict[bool, list[bytes]]) -> dict[str, Any]:
    stream, conc, n, warmup, limit = cell["stream"], cell["concurrency"], cell["n"], cell["warmup"], cell["time_limit"]
    pool = bodies[stream]
    latencies: list[float] = []
    errors = 0
    next_i = 0

    async def loop(total: int, record: bool, deadline: float) -> None:
        nonlocal next_i, errors
        while next_i < total and time.perf_counter() < deadline:
            i = next_i
            next_i += 1
            try:
                dt, ok = await one(pool[i % len(pool)])
            except Exception:
                ok, dt = False, 0.0
            if not ok:
                errors += 1
            elif record:
                latencies.append(dt)

    await asyncio.gather(*(loop(warmup, False, time.perf_counter() + 30) for _ in range(conc)))
    next_i, errors = 0, 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(loop(n, True, t0 + limit) for _ in range(conc)))
    cpu1, t1 = time.process_time(), time.perf_counter()
    ok = len(latencies)
    return {"stream": stream, "concurrency": conc, "ok": ok, "errors": errors, "elapsed_s": t1 - t0,
            "rps": ok / (t1 - t0), "cpu_us_per_req": (cpu1 - cpu0) / max(ok, 1) * 1e6,
            "p50_ms": percentile(latencies, 50) * 1e3, "p99_ms": percentile(latencies, 99) * 1e3}


def worker_main(args: argparse.Namespace) -> None:
    import uvloop

    cells = json.loads(args.cells)
    bodies = {s: [chat_body(i, MODEL, s, args.max_tokens) for i in range(512)] for s in (False, True)}
    run = _aiohttp_cells if args.worker == "aiohttp" else _httpx_cells
    out = uvloop.run(run(args.url + "/v1/chat/completions", cells, bodies))
    print(json.dumps(out))


# ---------------------------------------------------------------------------------------
# Orchestrator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round and fewer requests (~1 minute)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--n1", type=int, default=None, help="requests per cell at concurrency 1")
    ap.add_argument("--n32", type=int, default=None, help="requests per cell at concurrency 32")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--speedup", type=float, default=100000.0)
    ap.add_argument("--worker", choices=CLIENTS, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--cells", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args)
        return
    rounds = args.rounds or (1 if args.quick else 3)
    n1 = args.n1 or (300 if args.quick else 600)
    n32 = args.n32 or (1500 if args.quick else 3000)
    cells = [{"stream": s, "concurrency": c, "n": n1 if c == 1 else n32, "warmup": 20 if c == 1 else 200,
              "time_limit": 60.0} for s, c in CELLS]
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-http-"))
    engine = mock_engine("engine-0", tok, MODEL, log_dir, args.speedup)
    runs: list[dict[str, Any]] = []
    try:
        engine.start().wait_ready("/infera/worker", 60)
        for r in range(rounds):
            order = CLIENTS if r % 2 == 0 else CLIENTS[::-1]
            for client in order:
                e0 = engine.cpu()
                proc = subprocess.run([PYTHON, __file__, "--worker", client, "--url", engine.url, "--cells",
                                       json.dumps(cells), "--max-tokens", str(args.max_tokens)],
                                      capture_output=True, text=True, timeout=600, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"{client} worker failed:\n{proc.stderr[-2000:]}")
                engine_cpu = engine.cpu() - e0
                for res in json.loads(proc.stdout.strip().splitlines()[-1]):
                    runs.append({"round": r, "client": client, "engine_cpu_s": engine_cpu, **res})
                print(f"round {r + 1}/{rounds} {client}: done", file=sys.stderr)
    finally:
        stop_all([engine])
    summary = summarize(runs)
    print_table(summary)
    path = write_results("http_client", {"machine": machine_info(), "command": " ".join(sys.argv),
                                         "cells": cells, "runs": runs, "summary": summary})
    print(f"\nresults: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over rounds of each (client, stream, concurrency) figure, and httpx/aiohttp ratios."""
    out: list[dict[str, Any]] = []
    for stream, conc in CELLS:
        row: dict[str, Any] = {"stream": stream, "concurrency": conc}
        for client in CLIENTS:
            sel = [x for x in runs if x["client"] == client and x["stream"] == stream and x["concurrency"] == conc]
            for key in ("cpu_us_per_req", "p50_ms", "p99_ms", "rps"):
                row[f"{client}_{key}"] = median([x[key] for x in sel])
            row[f"{client}_errors"] = sum(x["errors"] for x in sel)
        row["cpu_ratio_httpx_over_aiohttp"] = row["httpx_cpu_us_per_req"] / row["aiohttp_cpu_us_per_req"]
        row["p50_ratio_httpx_over_aiohttp"] = row["httpx_p50_ms"] / row["aiohttp_p50_ms"]
        out.append(row)
    return out


def print_table(summary: list[dict[str, Any]]) -> None:
    head = (f"{'mode':<10}{'conc':>5} | {'aiohttp CPU µs/req':>18}{'httpx CPU µs/req':>17}{'ratio':>7} | "
            f"{'aiohttp p50 ms':>14}{'httpx p50 ms':>13}{'ratio':>7} | {'aiohttp rps':>11}{'httpx rps':>10}")
    print(head)
    print("-" * len(head))
    for row in summary:
        mode = "stream" if row["stream"] else "non-stream"
        print(f"{mode:<10}{row['concurrency']:>5} | {row['aiohttp_cpu_us_per_req']:>18.0f}"
              f"{row['httpx_cpu_us_per_req']:>17.0f}{row['cpu_ratio_httpx_over_aiohttp']:>7.2f} | "
              f"{row['aiohttp_p50_ms']:>14.2f}{row['httpx_p50_ms']:>13.2f}"
              f"{row['p50_ratio_httpx_over_aiohttp']:>7.2f} | "
              f"{row['aiohttp_rps']:>11.0f}{row['httpx_rps']:>10.0f}")


if __name__ == "__main__":
    main()
