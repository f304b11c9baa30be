"""The frontend's CPU per request, in process: infera at git ``--ref`` vs this tree, in rounds.

One mock engine (a subprocess, shared). Each round runs, for each tree in turn (the order alternating), a
child process that builds the round-robin frontend as ``python -m infera.server`` does (``build`` +
``server_for``, uvloop) and drives it from a raw asyncio client in the same process and loop (``--concurrency``
kept-alive connections, 1 by default, head and body in one write, ~1k-token chat, non-streamed or ``--stream``ed
(SSE, read to the last chunk), ``--max-tokens`` 8 by default). The child reports its own
CPU (``time.process_time``) per request over the measured requests: the frontend's work plus a small,
constant client, without the other processes' scheduling in the figure, which is what a loaded shared box
lets one compare; and the p50 of its requests (which does include the engine and the box).

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/lean_inproc.py --ref main --rounds 5 --n 2000
    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/lean_inproc.py --ref main --stream --concurrency 32
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


async def _drive(port: int, bodies: list[bytes], warmup: int, n: int, concurrency: int = 1) -> dict[str, float]:
    """``warmup`` then ``n`` requests over ``concurrency`` kept-alive connections, each posting in turn; a streamed
    answer (chunked) is read to its last chunk."""
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]

    async def post(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], body: bytes) -> float:
        reader, writer = conn
        started = time.perf_counter()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer: {head[:200]!r}")
        if b"transfer-encoding: chunked" in head:
            got = b""
            while not got.endswith(b"\r\n0\r\n\r\n"):
                got += await reader.read(1 << 16)
        else:
            length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:"))
            await reader.readexactly(length)
        return time.perf_counter() - started

    async def run(count: int, into: list[float]) -> None:
        left = iter(range(count))

        async def worker(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
            for i in left:
                into.append(await post(conn, bodies[i % len(bodies)]))
        await asyncio.gather(*(worker(conn) for conn in conns))

    await run(warmup, [])
    times: list[float] = []
    cpu0 = time.process_time()
    await run(n, times)
    cpu = time.process_time() - cpu0
    for _, writer in conns:
        writer.close()
    times.sort()
    return {"cpu_us": cpu / n * 1e6, "p50_ms": times[n // 2] * 1e3}


def child(engine_url: str, warmup: int, n: int, stream: bool = False, concurrency: int = 1,
          max_tokens: int = 8) -> None:
    import uvloop

    from bench.common import chat_body
    from harness import free_port, frontend_argv
    from infera.config import load
    from infera.config.server import ServerSettings
    from infera.server.__main__ import build, server_for

    port = free_port()
    argv = frontend_argv(port, [engine_url], policy="round-robin", args=("--log-level", "warning"))[3:]
    settings = load(ServerSettings, argv, {})
    bodies = [chat_body(i, MODEL, stream, max_tokens) for i in range(400)]

    async def main() -> dict[str, float]:
        server = server_for(build(settings), settings)
        task = asyncio.ensure_future(server.serve())
        try:
            deadline = time.monotonic() + 60
            while True:  # ready once the fleet view has the engine's model (a request is then a 200)
                assert not task.done(), "the frontend did not start"
                if server.started:
                    try:
                        return await _drive(port, bodies, warmup, n, concurrency)
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
    ap.add_argument("--stream", action="store_true", help="streamed requests (SSE, one event per token)")
    ap.add_argument("--concurrency", type=int, default=1, help="kept-alive client connections posting at once")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        url, warmup, n, stream, conc, max_tokens = args.child
        child(url, int(warmup), int(n), stream == "1", int(conc), int(max_tokens))
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
                out = subprocess.run([PYTHON, __file__, "--child", engine.url, str(args.warmup), str(args.n),
                                      str(int(args.stream)), str(args.concurrency), str(args.max_tokens)],
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
          f"ref {args.ref}; {'streamed' if args.stream else 'non-streamed'}, concurrency {args.concurrency}, "
          f"max_tokens {args.max_tokens}; medians over rounds")
    print("| tree | CPU µs/req (frontend + client, one process) | ratio | p50 ms |")
    print("|---|--:|--:|--:|")
    for name, rows in results.items():
        cpu = median([x["cpu_us"] for x in rows])
        print(f"| {name} | {cpu:.1f} | {cpu / ref_cpu:.3f}x | {median([x['p50_ms'] for x in rows]):.3f} |")


if __name__ == "__main__":
    main()
