"""How much CPU the mock engine spends per request, and how many requests/s it serves.

Starts ``python -m infera.engine.mock`` at a very large ``--speedup-ratio`` (so modelled
GPU time is negligible), drives it with N concurrent aiohttp clients, streaming and not,
and reads the mock process's CPU time (utime + stime from ``/proc/<pid>/stat``) before and
after each run. Prints a table. The point: the mock must not be what limits a router bench.

    .venv/bin/python bench/mock_engine.py --requests 3000 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import free_port, http_ok, mock_argv, spawn


async def drive(url: str, n: int, concurrency: int, stream: bool, chat: bool, prompt_chars: int,
                max_tokens: int) -> float:
    prefixes = [f"Shared prefix {k}: " + "lorem ipsum dolor sit amet " * (prompt_chars // 27) for k in range(8)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    path = "/v1/chat/completions" if chat else "/v1/completions"

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            text = prefixes[i % len(prefixes)] + f" question {i}"
            body: dict[str, object] = {"model": "mock-model", "max_tokens": max_tokens, "stream": stream}
            if chat:
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
            async with session.post(url + path, json=body) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"{resp.status}: {await resp.text()}")
                if stream:
                    async for _line in resp.content:
                        pass
                else:
                    await resp.read()

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--speedup-ratio", type=float, default=100000.0)
    ap.add_argument("--prompt-chars", type=int, default=1000, help="prompt length (byte-level tokenizer: = tokens)")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp(prefix="bench-mock-")) / "mock.log"
    proc = spawn(mock_argv(port, args=("--speedup-ratio", str(args.speedup_ratio))), url, log)
    rows = []
    try:
        proc.wait_until(lambda: http_ok(url + "/health"), 30, "healthy")
        asyncio.run(drive(url, 200, 16, False, False, args.prompt_chars, args.max_tokens))  # warm-up
        for chat in (False, True):
            for stream in (False, True):
                cpu0 = proc.cpu()
                wall = asyncio.run(drive(url, args.requests, args.concurrency, stream, chat, args.prompt_chars,
                                         args.max_tokens))
                cpu = proc.cpu() - cpu0
                rows.append(("chat" if chat else "completions", "yes" if stream else "no",
                             args.requests / wall, cpu / args.requests * 1e6, cpu / wall * 100))
    finally:
        proc.stop()

    cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor())
    print(f"machine: nproc={os.cpu_count()}, CPU {cpu_model}, Python {platform.python_version()}")
    print(f"workload: {args.requests} requests, {args.concurrency} concurrent clients, ~{args.prompt_chars}-token "
          f"prompts (8 shared prefixes), {args.max_tokens} output tokens, --speedup-ratio {args.speedup_ratio:g}")
    print(f"| {'endpoint':<12} | stream | requests/s | mock CPU us/request | mock CPU % of one core |")
    print(f"|{'-' * 14}|--------|-----------:|--------------------:|-----------------------:|")
    for endpoint, stream, rps, us, pct in rows:
        print(f"| {endpoint:<12} | {stream:<6} | {rps:10.0f} | {us:19.0f} | {pct:22.0f} |")


if __name__ == "__main__":
    main()
