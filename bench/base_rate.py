"""The round-robin frontend's CPU per request at routing_quality's rate and body size, ref vs this tree, interleaved.

routing_quality's non-streamed cells send ~20 requests a second of 2.0-2.7k-token chat prompts (8-12 KB JSON
bodies) and get a small JSON answer (32 tokens) back; round-robin costs ~1000 µs of router CPU a request there,
~900 of it outside the router's timed stages (bench/README.md, "Issue 15, eighteenth round: the request path every
policy pays"). This replays that shape with less noise than a cell: mock engines (``--engines``, 4 as
quality_cpu_split; ``--speedup`` as routing_quality's), one round-robin frontend of ``--ref-root``'s tree and one of
this tree, both up at once; a client sends the tenants workload's bodies (~18 KB each; not streamed, ``max_tokens``
32) at ``--rate`` per second (Poisson arrivals, aiohttp, kept-alive connections), in segments of ``--seconds``
alternating between the two frontends (the order flips every round). A frontend's CPU over a segment is read
from ``/proc/<pid>/task/*/schedstat``
(nanoseconds, all threads), divided by the requests it answered. ``--perf DIR`` also records ``perf record -g``
(cpu-clock) of each frontend over its segments: ``perf report -i DIR/<tree>.data``.

    PYTHONPATH=$PWD .venv/bin/python bench/base_rate.py --ref-root /tmp/ref --rounds 6 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workloads
from bench.common import default_tokenizer_dir, frontend, frontend_ready, median, mock_engine, stop_all

MODEL = "bench-model"


def cpu_ns(pid: int) -> int:
    """CPU nanoseconds of all of ``pid``'s threads (``schedstat``'s run time: no 10 ms tick)."""
    total = 0
    for tdir in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((tdir / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def bodies(max_tokens: int) -> list[bytes]:
    w = workloads.tenants(16, 720, 20.0, max_tokens)
    return [json.dumps({"model": MODEL, "messages": m, "max_tokens": max_tokens, "temperature": 0.0,
                        "stream": False}, separators=(",", ":")).encode() for m in w.messages]


async def segment(session: Any, url: str, pool: list[bytes], start: int, rate: float, seconds: float,
                  seed: int) -> tuple[int, int]:
    """``rate`` requests a second for ``seconds`` against ``url``: (answered 200, failed)."""
    rng = random.Random(seed)
    ok = failed = 0

    async def one(body: bytes) -> None:
        nonlocal ok, failed
        try:
            async with session.post(url + "/v1/chat/completions", data=body,
                                    headers={"content-type": "application/json"}) as resp:
                await resp.read()
                if resp.status == 200:
                    ok += 1
                else:
                    failed += 1
        except Exception:  # counted, not fatal
            failed += 1

    tasks = []
    t0 = time.monotonic()
    at = 0.0
    k = start
    while at < seconds:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(pool[k % len(pool)])))
        k += 1
        at += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    return ok, failed


async def run(urls: dict[str, str], pids: dict[str, int], pool: list[bytes], args: argparse.Namespace,
              perf_dir: Path | None) -> dict[str, list[float]]:
    import aiohttp

    out: dict[str, list[float]] = {name: [] for name in urls}
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        for url in urls.values():  # warm-up: the prompt shapes, the connections, the upstream pools
            await segment(session, url, pool, 0, args.rate, 3.0, 1)
        k = 0
        for r in range(args.rounds):
            order = list(urls) if r % 2 == 0 else list(urls)[::-1]
            for name in order:
                perf = None
                if perf_dir is not None:
                    dest = perf_dir / f"{name}-{r}"
                    cmd = (args.attach.format(pid=pids[name], out=dest).split() if args.attach else
                           ["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-g",
                            "-p", str(pids[name]), "-o", f"{dest}.data"])
                    perf = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
                    await asyncio.sleep(0.5)
                c0 = cpu_ns(pids[name])
                ok, failed = await segment(session, urls[name], pool, k, args.rate, args.seconds, 100 + r)
                c1 = cpu_ns(pids[name])
                if perf is not None:
                    perf.send_signal(2)
                    perf.wait(30)
                k += ok + failed
                per = (c1 - c0) / 1e3 / max(ok, 1)
                out[name].append(per)
                print(f"round {r} {name:>6}: {ok} ok {failed} failed  {per:7.1f} µs/req", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-root", type=Path, required=True, help="an exported tree with its C extensions built")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--speedup", type=float, default=5.0)
    ap.add_argument("--engines", type=int, default=4, help="as quality_cpu_split's default")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--perf", type=Path, default=None, help="record perf -g of each segment into this directory")
    ap.add_argument("--attach", default="", help="with --perf: this command instead of perf record, {pid} and {out} "
                    "filled in (e.g. 'strace -c -f -o {out}.strace -p {pid}'); stopped with SIGINT")
    args = ap.parse_args()
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-base-rate-"))
    extra = ["--num-kv-blocks", "4096", "--max-num-seqs", "256"]
    engines = [mock_engine(f"engine-{k}", tok, MODEL, log_dir, args.speedup, extra) for k in range(args.engines)]
    fronts = {"ref": frontend("ref", tok, "round-robin", engines, log_dir, root=args.ref_root.resolve()),
              "branch": frontend("branch", tok, "round-robin", engines, log_dir)}
    if args.perf is not None:
        args.perf.mkdir(parents=True, exist_ok=True)
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        for f in fronts.values():
            f.start()
        for f in fronts.values():
            f.wait_ready("/health", 90, frontend_ready(len(engines)))
        pool = bodies(args.max_tokens)
        pids = {name: f.pid for name, f in fronts.items()}
        got = asyncio.run(run({name: f.url for name, f in fronts.items()}, pids, pool, args, args.perf))
    finally:
        stop_all([*fronts.values(), *engines])
    ref = median(got["ref"])
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.rounds} rounds x {args.seconds:g} s at "
          f"{args.rate:g} req/s, mean body {sum(map(len, pool)) / len(pool) / 1e3:.1f} KB; medians over rounds")
    print("| tree | CPU µs/req | ratio | per round |")
    print("|---|--:|--:|---|")
    for name, rows in got.items():
        print(f"| {name} | {median(rows):.0f} | {median(rows) / ref:.3f}x | {' '.join(f'{x:.0f}' for x in rows)} |")
    pairs = [b / a for a, b in zip(got["ref"], got["branch"], strict=True)]
    print(f"branch/ref per round: {' '.join(f'{p:.3f}' for p in pairs)}; median {median(pairs):.3f}")


if __name__ == "__main__":
    main()
