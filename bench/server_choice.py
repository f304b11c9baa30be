"""HTTP server choice: CPU per request of the same proxy under uvicorn, granian and aiohttp.

One proxy (bench/asgi_proxy.py: round-robin over two mock engines, bodies passed through,
SSE streamed chunk by chunk) served by

  uvicorn   uvicorn + uvloop + httptools, as infera.server runs today (ASGI)
  granian   granian (Rust HTTP, ASGI interface, uvloop, 1 worker, 1 runtime thread)
  aiohttp   aiohttp.web on uvloop (not ASGI: the lean alternative, same proxy logic)

For each: CPU of the server's process tree per request (utime+stime, /proc), p50 latency
and requests/s, non-streamed at concurrency 1 and 16 and streamed at 16 (a streamed cell
also checks every response ends with [DONE]: the streaming smoke test). Scenario order
rotates each round; figures are medians over rounds.

    .venv/bin/python bench/server_choice.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    PYTHON,
    REPO,
    Proc,
    chat_body,
    cpu_seconds,
    default_tokenizer_dir,
    free_port,
    machine_info,
    make_session,
    median,
    mock_engine,
    percentile,
    run_load,
    stop_all,
    write_results,
)

MODEL = "bench-model"
SERVERS = ("uvicorn", "granian", "aiohttp")
CELLS = [(False, 1), (False, 16), (True, 16)]


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (granian serves from a child process)."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return total


def _server(name: str, engines: list[Proc], log_dir: Path) -> Proc:
    port = free_port()
    bin_dir = Path(PYTHON).parent
    argv = {
        "uvicorn": [PYTHON, "-m", "uvicorn", "bench.asgi_proxy:app", "--host", "127.0.0.1", "--port", str(port),
                    "--loop", "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log"],
        "granian": [str(bin_dir / "granian"), "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
                    "--workers", "1", "--runtime-threads", "1", "--loop", "uvloop", "--log-level", "warning",
                    "--no-ws", "bench.asgi_proxy:app"],
        "aiohttp": [PYTHON, "-m", "bench.asgi_proxy", "--port", str(port)],
    }[name]
    os.environ["PROXY_ENGINES"] = ",".join(e.url for e in engines)
    os.environ["PYTHONPATH"] = str(REPO)
    return Proc(name, argv, port, log_dir / f"{name}.log")


async def _measure(url: str, pid: int, bodies: dict[bool, list[bytes]], n: int) -> list[dict[str, Any]]:
    out = []
    async with make_session(32) as session:
        for stream in (False, True):
            res = await run_load(session, [url], bodies[stream], 8, 100, 30.0)
            if res.errors:
                raise RuntimeError(f"warm-up errors: {res.first_error}")
        for stream, conc in CELLS:
            c0 = _tree_cpu(pid)
            res = await run_load(session, [url], bodies[stream], conc, n, 60.0)
            cpu = _tree_cpu(pid) - c0
            out.append({"stream": stream, "concurrency": conc, "ok": res.ok, "errors": res.errors,
                        "first_error": res.first_error, "rps": res.rps,
                        "p50_ms": percentile(res.latencies, 50) * 1e3,
                        "cpu_us_per_req": cpu / max(res.ok, 1) * 1e6})
    return out


def run(quick: bool) -> dict[str, Any]:
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-servers-"))
    rounds = 1 if quick else 3
    n = 300 if quick else 800
    bodies = {s: [chat_body(i, MODEL, s, 8) for i in range(64)] for s in (False, True)}
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir) for i in range(2)]
    results: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in SERVERS}
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        for r in range(rounds):
            order = SERVERS[r % 3:] + SERVERS[: r % 3]
            for name in order:
                srv = _server(name, engines, log_dir / f"r{r}").start()
                try:
                    srv.wait_ready("/health", 30)
                    results[name].append(asyncio.run(_measure(srv.url + "/v1/chat/completions", srv.pid, bodies, n)))
                finally:
                    srv.stop()
    finally:
        stop_all(engines)
    table = {}
    for name, rs in results.items():
        table[name] = [{k: (median([r[i][k] for r in rs]) if isinstance(rs[0][i][k], float) else rs[0][i][k])
                        for k in rs[0][i]} | {"errors": sum(r[i]["errors"] for r in rs)} for i in range(len(CELLS))]
    return {"machine": machine_info(), "rounds": rounds, "requests_per_cell": n, "cells": table,
            "time": time.time()}


def print_report(res: dict[str, Any]) -> None:
    head = "".join(f"{('stream' if s else 'non-stream') + f' c={c}':>34}" for s, c in CELLS)
    print(f"{'server':<10}{head}")
    print(f"{'':<10}" + "".join(f"{'CPU µs/req':>14}{'p50 ms':>9}{'req/s':>8}{'err':>3}" for _ in CELLS))
    base = res["cells"]["uvicorn"]
    for name, cells in res["cells"].items():
        print(f"{name:<10}" + "".join(f"{c['cpu_us_per_req']:>14.0f}{c['p50_ms']:>9.2f}{c['rps']:>8.0f}"
                                      f"{c['errors']:>3}" for c in cells))
        print(f"{'  vs uvicorn':<10}" + "".join(f"{c['cpu_us_per_req'] / b['cpu_us_per_req']:>13.2f}x{'':>20}"
                                                for c, b in zip(cells, base, strict=True)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    res = run(args.quick)
    print_report(res)
    print(f"results: {write_results('server_choice', res)}")


if __name__ == "__main__":
    main()
