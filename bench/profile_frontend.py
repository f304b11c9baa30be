"""Where the kv-aware frontend's CPU goes, sampled by py-spy under load.

Four mock engines (negligible engine time) and one ``infera.server`` with
``--router-policy kv-aware``; the load is long multi-turn chat conversations
(bench/conversations.py: a shared ~1.5k-token system prompt, then turns of ~400 tokens, so
prompts grow from ~2k to ~8k tokens), half streamed, 8 in flight. py-spy samples the
frontend process (idle threads excluded) for ``--seconds``; the script prints the top
functions by inclusive and by own share and writes an SVG flame graph.

    .venv/bin/python bench/profile_frontend.py --label before   # bench/plots/frontend_flame_before.svg

``--chunk-cost`` instead measures the streamed relay's cost per SSE chunk, without py-spy:
the same requests with ``max_tokens`` 64, all non-streamed then all streamed (one chunk a
token), frontend CPU per request each way; (streamed - non-streamed) / 64 is what a chunk
costs beyond receiving the same tokens in one body.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    PLOTS,
    PYTHON,
    default_tokenizer_dir,
    frontend,
    frontend_ready,
    make_session,
    mock_engine,
    run_load,
    stop_all,
    write_results,
)
from bench.conversations import chat_body_from, multi_turn_conversation

MODEL = "bench-model"


def _bodies(sessions: int, turns: int, max_tokens: int = 16) -> dict[bool, list[bytes]]:
    """Turn t of every session, in turn order: each request extends one the router saw before."""
    out: dict[bool, list[bytes]] = {False: [], True: []}
    convs = [multi_turn_conversation(s, turns) for s in range(sessions)]
    for t in range(turns):
        for s in range(sessions):
            for stream in (False, True):
                out[stream].append(chat_body_from(convs[s][t], MODEL, stream, max_tokens))
    return out


CHUNK_TOKENS = 64


async def _chunk_cost(url: str, front: Any, bodies: dict[bool, list[bytes]], rounds: int = 3) -> dict[str, float]:
    """Frontend CPU µs per request, non-streamed and streamed, alternating, medians over rounds."""
    import statistics

    per: dict[bool, list[float]] = {False: [], True: []}
    async with make_session(16) as session:
        for _ in range(rounds):
            for stream in (False, True):
                c0 = front.cpu()
                res = await run_load(session, [url], bodies[stream], 4, 8 * len(bodies[stream]), 120.0)
                if res.errors:
                    raise RuntimeError(f"load errors: {res.first_error}")
                per[stream].append((front.cpu() - c0) / max(res.ok, 1) * 1e6)
    non, st = statistics.median(per[False]), statistics.median(per[True])
    return {"nonstream_us": non, "stream_us": st, "chunks": CHUNK_TOKENS, "per_chunk_us": (st - non) / CHUNK_TOKENS}


def _top(raw: Path, n: int) -> dict[str, list[tuple[str, float]]]:
    """Top frames by inclusive and by own share, from py-spy's collapsed-stack output."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        total += k
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += k
        own[frames[-1]] += k
    total = max(total, 1)
    return {"inclusive": [(f, c / total) for f, c in inclusive.most_common(n)],
            "own": [(f, c / total) for f, c in own.most_common(n)], "samples": [("total", float(total))]}


async def _drive(url: str, bodies: dict[bool, list[bytes]], seconds: float) -> int:
    done = 0
    async with make_session(16) as session:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for stream in (False, True):
                res = await run_load(session, [url], bodies[stream], 4, len(bodies[stream]), 30.0)
                if res.errors:
                    raise RuntimeError(f"load errors: {res.first_error}")
                done += res.ok
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="before")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--policy", default="kv-aware", help="the frontend's --router-policy (round-robin: no prompts)")
    ap.add_argument("--chunk-cost", action="store_true", help="measure the relay's cost per SSE chunk instead")
    args = ap.parse_args()
    pyspy = shutil.which("py-spy", path=str(Path(PYTHON).parent)) or shutil.which("py-spy")
    if pyspy is None:
        raise SystemExit("py-spy not found: pip install py-spy (it is in the dev extra)")
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-profile-"))
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir) for i in range(4)]
    procs: list[Any] = list(engines)
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        front = frontend("frontend", tok, args.policy, engines, log_dir).start()
        procs.append(front)
        front.wait_ready("/health", 90, frontend_ready(len(engines)))
        url = front.url + "/v1/chat/completions"
        if args.chunk_cost:
            cost = asyncio.run(_chunk_cost(url, front, _bodies(args.sessions, 4, CHUNK_TOKENS)))
            print(f"frontend CPU per request: non-streamed {cost['nonstream_us']:.0f} µs, streamed "
                  f"{cost['stream_us']:.0f} µs ({CHUNK_TOKENS} chunks): {cost['per_chunk_us']:.1f} µs per chunk")
            print(f"results: {write_results('chunk_cost', cost)}")
            return
        bodies = _bodies(args.sessions, args.turns)
        asyncio.run(_drive(url, bodies, 3.0))  # warm up
        raw = log_dir / "profile.txt"
        PLOTS.mkdir(parents=True, exist_ok=True)
        svg = PLOTS / f"frontend_flame_{args.label}.svg"
        recorders = [subprocess.Popen([pyspy, "record", "--pid", str(front.pid), "--rate", "200", "--duration",
                                       str(int(args.seconds)), "--format", fmt, "--output", str(out), "--nonblocking"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                     for fmt, out in (("raw", raw), ("flamegraph", svg))]
        cpu0 = front.cpu()
        n = asyncio.run(_drive(url, bodies, args.seconds))
        cpu = front.cpu() - cpu0
        for r in recorders:
            r.wait(60)
        top = _top(raw, args.top)
    finally:
        stop_all(procs)
    print(f"{n} requests, frontend CPU {cpu / max(n, 1) * 1e6:.0f} µs/request (py-spy attached: inflated)")
    for kind in ("inclusive", "own"):
        print(f"top by {kind} share:")
        for name, share in top[kind]:
            print(f"  {share:6.1%}  {name}")
    print(f"flame graph: {svg}")
    res = {"requests": n, "cpu_us_per_req": cpu / max(n, 1) * 1e6, **top}
    print(f"results: {write_results('profile_' + args.label, res)}")


if __name__ == "__main__":
    main()
