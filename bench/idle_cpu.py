"""Idle CPU: what each router burns over a fleet of mock engines while no request arrives.

N mock engines (static discovery, ZMQ KV events) and, in front of all of them at once, infera
round-robin and kv-aware (this tree, and with ``--ref`` the same two from that git ref's tree), and
sglang-router / vllm-router cache_aware where their venvs exist (bench/peers.py; never installed
here). After every router lists every engine and a settle, ``--windows`` windows of ``--seconds``
each: per router, CPU (schedstat run time, all threads) in ms per second of wall time, and wakeups per
second (voluntary context switches summed over the process's threads: a thread that sleeps in
epoll/futex and is woken counts one). Reported per router: the median window and the range.

    .venv/bin/python bench/idle_cpu.py --ref main --windows 4 --seconds 30
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers
from bench.common import (
    Proc,
    default_tokenizer_dir,
    export_ref,
    frontend,
    frontend_ready,
    machine_info,
    median,
    mock_engine,
    stop_all,
    write_results,
)

PEERS = {"sglang cache_aware": "sglang-router", "vllm cache_aware": "vllm-router"}


def run_ns(pid: int) -> int:
    """CPU time (ns) of every live thread of ``pid``, from schedstat (the 10 ms ticks of /proc/<pid>/stat
    are too coarse for a process that burns a few ms a second)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except OSError:  # the thread ended
            continue
    return total


def switches(pid: int) -> int:
    """Voluntary context switches of every live thread of ``pid``."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:  # the thread ended
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--ref", default="", help="also run infera rr/kv from this git ref's tree (e.g. main)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--args", default="", help="extra flags for this tree's infera frontends (not the ref's), "
                    "e.g. '--worker-poll-interval 10'")
    args = ap.parse_args()
    info = machine_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    tok = default_tokenizer_dir()
    log = Path(tempfile.mkdtemp(prefix="idle-cpu-"))
    engines = [mock_engine(f"e{k}", tok, "m", log, 1.0) for k in range(args.engines)]
    routers: dict[str, Proc] = {}
    ref_root = export_ref(args.ref, log / "ref") if args.ref else None
    trees = [("", None)] + ([(f" @{args.ref}", ref_root)] if ref_root is not None else [])
    for tag, root in trees:
        extra = args.args.split() if root is None else []
        for label, policy in (("rr", "round-robin"), ("kv", "kv-aware")):
            routers[f"infera {label}{tag}"] = frontend(f"infera-{label}{tag.strip()}", tok, policy, engines, log, root,
                                                       extra)
    if not args.no_peers:
        for label, package in PEERS.items():
            peer = peers.ensure(package, install=False)
            if peer.error:
                print(f"{label}: skipped ({peer.error})")
                continue
            routers[label] = peers.router(peer, "cache_aware", [e.url for e in engines], log, tok)
    cpu: dict[str, list[float]] = {n: [] for n in routers}
    wake: dict[str, list[float]] = {n: [] for n in routers}
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        for p in routers.values():
            p.start()
        for name, p in routers.items():
            if name.startswith("infera"):
                p.wait_ready("/health", 90, frontend_ready(args.engines))
            else:
                peers.wait_ready(p, args.engines)
        time.sleep(args.settle)
        for w in range(args.windows):
            t0 = time.monotonic()
            c0 = {n: run_ns(p.pid) for n, p in routers.items()}
            s0 = {n: switches(p.pid) for n, p in routers.items()}
            time.sleep(args.seconds)
            dt = time.monotonic() - t0
            for n, p in routers.items():
                cpu[n].append((run_ns(p.pid) - c0[n]) / 1e6 / dt)
                wake[n].append((switches(p.pid) - s0[n]) / dt)
            print(f"window {w + 1}/{args.windows}: " + ", ".join(f"{n} {cpu[n][-1]:.2f}" for n in routers), flush=True)
    finally:
        stop_all([*routers.values(), *engines])
    print(f"\nidle CPU over {args.engines} mock engines, {args.windows} windows of {args.seconds:.0f} s "
          f"(load average at start {' '.join(info['loadavg_at_start'])})")
    print(f"{'router':<24} {'CPU ms/s (median)':>18} {'range':>14} {'wakeups/s':>10}")
    for n in routers:
        print(f"{n:<24} {median(cpu[n]):>18.2f} {min(cpu[n]):>6.2f}-{max(cpu[n]):<7.2f} {median(wake[n]):>10.1f}")
    path = write_results("idle_cpu", {"machine": info, "args": vars(args), "cpu_ms_per_s": cpu,
                                      "wakeups_per_s": wake})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
