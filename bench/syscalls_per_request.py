"""Syscalls (strace -c) and CPU per request of one router process under router_overhead's c=32 non-streamed load.

Two mock engines, one router (``rr``, ``kv``: an infera frontend of this tree or ``--root``'s export;
``sgl-rr``, ``sgl-ca``: sglang-router from .cache/peers), ~1k-token chat requests as bench/router_overhead.py
sends them, 32 in flight, not streamed. After a warm-up, the load runs twice: once bare (router CPU µs per
request from /proc), once with ``strace -c -f`` attached to every thread of the router (syscall counts per
request; strace slows the process, so its CPU is not the figure). ``--perf`` adds a ``perf record -g`` of the
bare run and prints the shared objects' shares (``perf report --sort dso``).

    PYTHONPATH=$PWD .venv/bin/python bench/syscalls_per_request.py --scenario rr
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers
from bench.common import (
    chat_body,
    default_tokenizer_dir,
    frontend,
    frontend_ready,
    make_session,
    mock_engine,
    run_load,
    stop_all,
)

MODEL = "bench-model"
POLICIES = {"rr": "round-robin", "kv": "kv-aware", "sgl-rr": "round_robin", "sgl-ca": "cache_aware"}


def _cpu(pid: int) -> float:
    total = 0.0
    for task in os.listdir(f"/proc/{pid}/task"):
        raw = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        fields = raw[raw.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def _load(url: str, bodies: list[bytes], n: int, conc: int) -> int:
    async with make_session(64) as session:
        res = await run_load(session, [url], bodies, conc, n, 300.0)
        if res.errors:
            raise RuntimeError(res.first_error)
        return res.ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="rr", choices=sorted(POLICIES))
    ap.add_argument("--root", type=Path, default=None, help="an exported tree whose infera runs (default: this one)")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--perf", action="store_true")
    ap.add_argument("--stat", action="store_true", help="perf stat the bare run: instructions, cycles, switches")
    ap.add_argument("--pyspy", action="store_true", help="py-spy record the bare run (its top functions, own share)")
    args = ap.parse_args()
    tok = default_tokenizer_dir()
    bodies = [chat_body(i, MODEL, False, 8) for i in range(512)]
    log_dir = Path(tempfile.mkdtemp(prefix="syscalls-"))
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir, 100000.0, ["--num-kv-blocks", "4096"])
               for i in range(2)]
    fronts = []
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        if args.scenario.startswith("sgl"):
            front = peers.router(peers.ensure("sglang-router", install=False), POLICIES[args.scenario],
                                 [e.url for e in engines], log_dir, tok)
        else:
            front = frontend("frontend", tok, POLICIES[args.scenario], engines, log_dir, args.root)
        fronts.append(front)
        front.start()
        if args.scenario.startswith("sgl"):
            peers.wait_ready(front, 2)
        else:
            front.wait_ready("/health", 90, frontend_ready(2))
        url = front.url + "/v1/chat/completions"
        asyncio.run(_load(url, bodies, 1000, 8))
        perf = None
        if args.perf:
            perf = subprocess.Popen(["/usr/bin/perf", "record", "-g", "-q", "-o", str(log_dir / "perf.data"),
                                     "-p", str(front.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        spy = None
        if args.stat:
            perf = subprocess.Popen(["/usr/bin/perf", "stat", "-x", ",", "-o", str(log_dir / "stat.txt"), "-e",
                                     "instructions,cycles,context-switches,cpu-migrations,page-faults",
                                     "-p", str(front.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        if args.pyspy:
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-r", "200", "-f", "raw",
                                    "-o", str(log_dir / "spy.txt"), "-p", str(front.pid)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        c0 = _cpu(front.pid)
        ok = asyncio.run(_load(url, bodies, args.n, args.concurrency))
        cpu = (_cpu(front.pid) - c0) / ok * 1e6
        for proc in (perf, spy):
            if proc is not None:
                proc.send_signal(signal.SIGINT)
                proc.wait()
        print(f"{args.scenario}: {ok} requests, router CPU {cpu:.0f} µs/request (bare run)")
        if args.stat:
            for line in (log_dir / "stat.txt").read_text().splitlines():
                fields = line.split(",")
                if len(fields) > 2 and fields[0].replace(".", "").isdigit():
                    print(f"  {fields[2]:<18} {float(fields[0]) / ok:12.1f} per request")
        out = log_dir / "strace.txt"
        strace = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(front.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        ok = asyncio.run(_load(url, bodies, args.n, args.concurrency))
        strace.send_signal(signal.SIGINT)
        strace.wait()
        print(f"syscalls per request ({ok} requests under strace):")
        for line in out.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[3].isdigit():
                name = parts[-1]
                print(f"  {name:<16} {int(parts[3]) / ok:6.2f}")
            elif parts and parts[-1] == "total" and parts[-2].isdigit():
                print(f"  {'total':<16} {int(parts[-2]) / ok:6.2f}")
        if perf is not None:
            report = subprocess.run(["/usr/bin/perf", "report", "-i", str(log_dir / "perf.data"), "--no-children",
                                     "--sort", "dso", "--stdio", "-q"], capture_output=True, text=True)
            print("perf, share of samples by shared object:")
            for line in report.stdout.splitlines()[:14]:
                if line.strip():
                    print("  " + line.strip())
        print(f"logs: {log_dir}")
    finally:
        stop_all([*fronts, *engines])


if __name__ == "__main__":
    main()
