"""A live kv-aware frontend's CPU per request, per thread: the event loop's thread, libzmq's I/O thread
(``ZMQbg/IO/0``, which receives the engines' KV events) and the rest, a git ref's tree against this one.

Two mock engines (x100000) and one kv-aware frontend per run, router_overhead.py's ~1k-token chat
requests, non-streamed, ``max_tokens`` 8, at concurrency ``--c``; the frontend's threads' CPU time
(/proc/<pid>/task/*/schedstat) over ``--n`` requests after a warm-up. The ref's frontend and this tree's run
alternately, ``--rounds`` times; per-thread medians and the ratio of the totals.

    .venv/bin/python bench/kv_intake_threads.py --ref main --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness.process
from bench.common import (
    chat_body,
    default_tokenizer_dir,
    export_ref,
    frontend,
    frontend_ready,
    make_session,
    mock_engine,
    run_load,
    stop_all,
)

MODEL = "bench-model"


def threads_cpu(pid: int) -> Counter[str]:
    """CPU seconds so far by thread kind: loop (the main thread), zmq-io, other."""
    out: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            cpu = int((task / "schedstat").read_text().split()[0]) / 1e9  # ns on a CPU (finer than stat's ticks)
        except OSError:
            continue
        kind = "loop" if task.name == str(pid) else "zmq-io" if comm.startswith("ZMQbg/IO") else "other"
        out[kind] += cpu
    return out


def one(tree: Path, n: int, c: int, tok: Path, log_dir: Path) -> dict[str, float]:
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir) for i in range(2)]
    front = frontend("kv", tok, "kv-aware", engines, log_dir)
    front.env["PYTHONPATH"] = str(tree)
    saved = harness.process.REPO
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        harness.process.REPO = tree  # the child's cwd: `python -m` imports from there first
        front.start()
        harness.process.REPO = saved
        front.wait_ready("/health", 90, frontend_ready(len(engines)))
        bodies = [chat_body(i, MODEL, False, 8) for i in range(4096)]
        urls = [front.url + "/v1/chat/completions"]

        async def load(count: int, offset: int) -> int:
            async with make_session(c) as session:
                return (await run_load(session, urls, bodies, c, count, 300.0, offset)).ok

        asyncio.run(load(max(100, n // 5), 0))
        before = threads_cpu(front.pid)
        ok = asyncio.run(load(n, 1000))
        after = threads_cpu(front.pid)
        return {k: (after[k] - before[k]) / max(ok, 1) * 1e6 for k in ("loop", "zmq-io", "other")}
    finally:
        harness.process.REPO = saved
        stop_all([front, *engines])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--c", type=int, default=1)
    args = ap.parse_args()
    here = Path(__file__).resolve().parent.parent
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-intake-"))
    ref = export_ref(args.ref, Path(tempfile.mkdtemp(prefix="infera-ref-")))  # with its own C extensions
    runs: dict[str, list[dict[str, float]]] = {"ref": [], "tree": []}
    for r in range(args.rounds):
        order = [("ref", ref), ("tree", here)] if r % 2 == 0 else [("tree", here), ("ref", ref)]
        for name, tree in order:
            runs[name].append(one(tree, args.n, args.c, tok, log_dir))
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in runs[name][-1].items())
                  + " µs/req", flush=True)
    for name in ("ref", "tree"):
        med = {k: statistics.median(x[k] for x in runs[name]) for k in ("loop", "zmq-io", "other")}
        print(f"{args.ref if name == 'ref' else 'this tree'}: " + ", ".join(f"{k} {v:.0f}" for k, v in med.items())
              + f", total {sum(med.values()):.0f} µs per request (median of {args.rounds})")
    ratios = [sum(t.values()) / sum(f.values()) for t, f in zip(runs["tree"], runs["ref"], strict=True)]
    print("total, this tree / ref per round: " + ", ".join(f"{x:.2f}" for x in ratios)
          + f" (median {statistics.median(ratios):.2f}×)")


if __name__ == "__main__":
    main()
