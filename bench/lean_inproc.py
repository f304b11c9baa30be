"""The frontend's CPU per request at concurrency 1, in process: infera at git ``--ref`` vs this tree, in rounds.

One mock engine (a subprocess, shared). Each round runs, for each tree in turn (the order alternating), a
child process that builds the round-robin frontend as ``python -m infera.server`` does (``build`` +
``server_for``, uvloop) and drives it from a raw asyncio client in the same process and loop (one kept-alive
connection, head and body in one write, ~1k-token chat, non-streamed, 8 tokens). The child reports its own
CPU (``time.process_time``) per request over the measured requests: the frontend's work plus a small,
constant client, without the other processes' scheduling in the figure, which is what a loaded shared box
lets one compare; and the p50 of its requests (which does include the engine and the box).

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/lean_inproc.py --ref main --rounds 5 --n 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# appended, not first: a --child's PYTHONPATH decides whose infera it imports (the ref's export comes first for the
# ref); this tree is only where bench/ and harness/ are found
sys.path.append(str(Path(__file__).resolve().parent.parent))

MODEL = "bench-model"


async def _drive(port: int, bodies: list[bytes], warmup: int, n: int) -> dict[str, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def post(body: bytes) -> float:
        started = time.perf_counter()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer: {head[:200]!r}")
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        await reader.readexactly(length)
        return time.perf_counter() - started

    for i in range(warmup):
        await post(bodies[i % len(bodies)])
    times = []
    cpu0 = time.process_time()
    for i in range(n):
        times.append(await post(bodies[i % len(bodies)]))
    cpu = time.process_time() - cpu0
    writer.close()
    times.sort()
    return {"cpu_us": cpu / n * 1e6, "p50_ms": times[n // 2] * 1e3}


def child(engine_url: str, warmup: int, n: int) -> None:
    import uvloop

    from bench.common import chat_body
    from harness import free_port, frontend_argv
    from infera.config import load
    from infera.config.server import ServerSettings
    from infera.server.__main__ import build, server_for

    port = free_port()
    argv = frontend_argv(port, [engine_url], policy="round-robin", args=("--log-level", "warning"))[3:]
    settings = load(ServerSettings, argv, {})
    bodies = [chat_body(i, MODEL, False, 8) for i in range(400)]

    async def main() -> dict[str, float]:
        server = server_for(build(settings), settings)
        task = asyncio.ensure_future(server.serve())
        try:
            deadline = time.monotonic() + 60
            while True:  # ready once the fleet view has the engine's model (a request is then a 200)
                assert not task.done(), "the frontend did not start"
                if server.started:
                    try:
                        return await _drive(port, bodies, warmup, n)
                    except (RuntimeError, OSError):
                        if time.monotonic() > deadline:
                            raise
                await asyncio.sleep(0.1)
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)

    import infera

    print(json.dumps({**uvloop.run(main()), "infera": str(Path(infera.__file__).parent)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="git ref of the 'before' frontend")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000, help="measured requests per tree per round")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    from bench.common import PYTHON, REPO, default_tokenizer_dir, export_ref, median, mock_engine, stop_all

    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-lean-inproc-"))
    base = export_ref(args.ref, log_dir / "base")  # with its own C extensions
    trees = {args.ref: f"{base}{os.pathsep}{REPO}", "branch": str(REPO)}  # the ref's infera first on the path
    engine = mock_engine("engine", default_tokenizer_dir(), MODEL, log_dir)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        engine.start()
        engine.wait_ready("/infera/worker", 60)
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for name in order:
                out = subprocess.run([PYTHON, __file__, "--child", engine.url, str(args.warmup), str(args.n)],
                                     env={**os.environ, "PYTHONPATH": trees[name]}, check=True,
                                     capture_output=True, text=True).stdout
                result = json.loads(out.strip().splitlines()[-1])
                want = base / "infera" if name == args.ref else REPO / "infera"
                got = Path(result.pop("infera"))
                if got != want:  # an A/B of one tree against itself says nothing
                    raise SystemExit(f"the {name} child imported infera from {got} instead of {want}")
                results[name].append(result)
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]['cpu_us']:.0f} us/req p50 {v[-1]['p50_ms']:.3f} ms"
                                             for k, v in results.items()), flush=True)
    finally:
        stop_all([engine])
    ref_cpu = median([x["cpu_us"] for x in results[args.ref]])
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.rounds} rounds x {args.n} requests, "
          f"ref {args.ref}; medians over rounds")
    print("| tree | CPU µs/req (frontend + client, one process) | ratio | p50 ms |")
    print("|---|--:|--:|--:|")
    for name, rows in results.items():
        cpu = median([x["cpu_us"] for x in rows])
        print(f"| {name} | {cpu:.1f} | {cpu / ref_cpu:.3f}x | {median([x['p50_ms'] for x in rows]):.3f} |")


if __name__ == "__main__":
    main()
