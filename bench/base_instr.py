"""Instructions per non-streamed round-robin request of the frontend (callgrind), ``--ref-root``'s tree vs this one.

A live CPU figure at routing_quality's rate moves ±10 % between rounds on a shared box (bench/base_rate.py); an
instruction count does not. Each tree's child builds the round-robin frontend as ``python -m infera.server`` does
(``build`` + ``server_for``, uvloop; no health poll in the run) over ``--engines`` mock engines (subprocesses,
outside valgrind) and drives it
from a raw client in the same process (one kept-alive connection, head and body in one write) with the tenants
workload's bodies (~18 KB, ``max_tokens`` 32, not streamed), one request at a time, under ``valgrind
--tool=callgrind``, counting only the ``--n`` requests after the warm-up (the child calls ``getppid`` and ``getpgrp``
around them: ``--zero-before`` and ``--dump-before``): the instructions per request of the frontend and the client
(whose share is small and the same for both trees). Exact counts: a change shows in one run, whatever the load.

    PYTHONPATH=$PWD .venv/bin/python bench/base_instr.py --ref-root /tmp/ref --n 150
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

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after the child's PYTHONPATH: its tree's infera

MODEL = "bench-model"


async def _drive(port: int, bodies: list[bytes], warmup: int, n: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(warmup + n):
        if i == warmup:
            os.getppid()  # callgrind's --zero-before: the counts start here
        body = bodies[i % len(bodies)]
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer: {head[:200]!r}")
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        await reader.readexactly(length)
    os.getpgrp()  # callgrind's --dump-before: the window's counts are written here
    writer.close()


def child(urls: list[str], warmup: int, n: int) -> None:
    import uvloop

    from bench.base_rate import bodies
    from harness import free_port, frontend_argv
    from infera.config import load
    from infera.config.server import ServerSettings
    from infera.server.__main__ import build, server_for

    port = free_port()
    argv = frontend_argv(port, urls, policy="round-robin",
                         args=("--log-level", "warning", "--worker-poll-interval", "3600"))[3:]
    settings = load(ServerSettings, argv, {})
    pool = bodies(32)[:200]

    async def main() -> None:
        server = server_for(build(settings), settings)
        task = asyncio.ensure_future(server.serve())
        try:
            deadline = time.monotonic() + 600
            while True:  # ready once a request is a 200 (the static fleet's first check has the engines)
                assert not task.done(), "the frontend did not start"
                if server.started:
                    try:
                        await _drive(port, pool, warmup, n)
                        return
                    except (RuntimeError, OSError):
                        if time.monotonic() > deadline:
                            raise
                await asyncio.sleep(0.2)
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 60)

    uvloop.run(main())


def instructions(out: Path) -> int:
    """The dump's ``summary:`` line (its ``totals:`` line, printed too, has disagreed with it: bench/README.md)."""
    found = {}
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            key, value = line.split()[:2]
            found[key] = int(value)
    if "summary:" not in found:
        raise SystemExit(f"no summary in {out}")
    print(f"{out.name}: {found}", file=sys.stderr)
    return found["summary:"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-root", type=Path, help="an exported tree with its C extensions built")
    ap.add_argument("--n", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[2:], int(args.child[0]), int(args.child[1]))
        return
    if args.ref_root is None:
        ap.error("--ref-root is required")
    from bench.common import PYTHON, REPO, default_tokenizer_dir, mock_engine, stop_all

    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-base-instr-"))
    extra = ["--num-kv-blocks", "4096", "--max-num-seqs", "256"]
    engines = [mock_engine(f"engine-{k}", default_tokenizer_dir(), MODEL, log_dir, 100000.0, extra)
               for k in range(args.engines)]
    trees = {"ref": f"{args.ref_root.resolve()}{os.pathsep}{REPO}", "branch": str(REPO)}
    got: dict[str, int] = {}
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        procs = []
        for name in trees:  # both at once (the box has two cores)
            out = log_dir / f"{name}.callgrind"
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--zero-before=getppid",
                   "--dump-before=getpgrp", PYTHON, __file__, "--child", str(args.warmup), str(args.n),
                   *[e.url for e in engines]]
            env = {**os.environ, "PYTHONPATH": trees[name], "PYTHONHASHSEED": "0"}  # the same dict layouts in both
            procs.append((name, out, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        for name, out, p in procs:
            _, err = p.communicate()
            if p.returncode:
                raise SystemExit(f"{name} failed: {err.decode()[-2000:]}")
            got[name] = instructions(Path(f"{out}.1"))  # the first dump: the window
    finally:
        stop_all(engines)
    per = {name: total / args.n for name, total in got.items()}
    print(json.dumps(got))
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.engines} engines, {args.n} requests "
          f"after {args.warmup}")
    print("| tree | instructions per request | ratio |")
    print("|---|--:|--:|")
    for name, value in per.items():
        print(f"| {name} | {value:,.0f} | {value / per['ref']:.3f}x |")


if __name__ == "__main__":
    main()
