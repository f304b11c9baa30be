"""A request's whole router path in process: ``Router.dispatch`` (place, send, the first byte) and the response's
``close`` (the request's end), CPU µs per request, kv-aware and round-robin, this tree against another tree's infera.

routing_quality's workloads (bench/kv_stages.py's bodies, its virtual clock: both trees make the same decisions) on
tests.fakes' FakeTransport, a non-streamed answer taken as the relay takes it (the first chunk, then close);
``--thrash MB`` copied between requests (untimed) leaves the caches as a live frontend's. Unlike kv_stages.py this
times the legs' send and end (``Legs.run``, the response's close) with the rest; the context stage (the same code in
both trees here) is inside the figure too. Each (tree, policy) runs in a fresh process, the trees alternating per round.

    PYTHONPATH=$PWD .venv/bin/python bench/dispatch_cpu.py --ref-root /tmp/ref_tree --rounds 3 --thrash 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import asyncio, itertools, json, random, sys, time
sys.path.insert(0, {root!r})
import orjson
from bench import kv_stages
from bench.common import default_tokenizer_dir
from infera.kv.tokenizer import PromptRenderer
from infera.protocols.worker import Capacity
from infera.router.context import RouteRequest
from infera.router.router import Router, RouterOptions
from tests.fakes import FakeFleet, FakeTransport, worker
bodies, cold_every, n_workers, max_tokens = kv_stages.workload_bodies({workload!r})
payloads = [orjson.loads(b) for b in bodies]
renderer = PromptRenderer.from_dir(default_tokenizer_dir())
fleet = FakeFleet(*[worker(f"w{{k}}", model="m", kv_block_size=16, capacity=Capacity(kv_blocks=100000))
                    for k in range(n_workers)])
ticks = itertools.count(1)
router = Router(fleet, FakeTransport(), None, renderer, RouterOptions(policy={policy!r}), rng=random.Random(1),
                clock=lambda: 1000.0 + next(ticks) * 1e-4)
prompts = renderer.prompt_cache
scratch = bytearray(int({thrash!r} * (1 << 20)))
async def main():
    spent = 0
    for i in range({warmup} + {n}):
        if scratch:
            bytes(scratch)
        if cold_every and i % cold_every == 0 and prompts is not None:
            prompts.clear()
        k = i % len(bodies)
        req = RouteRequest(kind="chat", path="/v1/chat/completions", body=bodies[k], payload=payloads[k], model="m",
                           max_tokens=max_tokens)
        t = time.thread_time_ns()
        routed = await router.dispatch(req, {{}})
        routed.close()
        if i >= {warmup}:
            spent += time.thread_time_ns() - t
    return spent / {n} / 1e3
print(json.dumps(asyncio.run(main())))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-root", required=True, help="the other tree (its infera/ and bench/ first on the path)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--workload", default="tenants", choices=("chats", "tenants", "multiturn"))
    ap.add_argument("--policies", default="round-robin,kv-aware")
    ap.add_argument("--thrash", type=float, default=16.0, metavar="MB")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    trees = {"ref": args.ref_root, "this tree": here}
    got: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
        for policy in args.policies.split(","):
            for name, root in order:
                code = CHILD.format(root=root, policy=policy, workload=args.workload, thrash=args.thrash,
                                    warmup=args.warmup, n=args.n)
                out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                     cwd=root)
                us = float(json.loads(out.stdout.strip().splitlines()[-1]))
                got.setdefault((policy, name), []).append(us)
                print(f"round {r + 1} {policy:12} {name:9} {us:8.1f} µs/request", flush=True)
    for policy in args.policies.split(","):
        ref, ours = statistics.median(got[(policy, "ref")]), statistics.median(got[(policy, "this tree")])
        print(f"{args.workload} {policy:12} median ref {ref:7.1f}  this tree {ours:7.1f}  ({ours / ref:.3f}x)")


if __name__ == "__main__":
    main()
