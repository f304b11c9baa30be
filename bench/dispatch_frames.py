"""Python frames and bytecodes per request of ``Router.dispatch`` + the response's ``close``, by function: a count, not
a time, so a loaded box cannot blur it. routing_quality's workloads (bench/kv_stages.py's bodies) on tests.fakes'
FakeTransport under kv_stages' virtual clock; ``--n`` requests traced with ``sys.settrace`` and opcode events after as
many untraced. Run it with another tree's infera first on the path to compare trees.

    PYTHONPATH=$PWD .venv/bin/python bench/dispatch_frames.py --policy kv-aware [--root /tmp/ref_tree]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import random
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--policy", default="kv-aware")
    ap.add_argument("--workload", default="tenants", choices=("chats", "tenants", "multiturn"))
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    sys.path.insert(0, args.root)
    import orjson

    from bench import kv_stages
    from bench.common import default_tokenizer_dir, opcode_tracer
    from infera.kv.tokenizer import PromptRenderer
    from infera.protocols.worker import Capacity
    from infera.router.context import RouteRequest
    from infera.router.router import Router, RouterOptions
    from tests.fakes import FakeFleet, FakeTransport, worker

    bodies, _, n_workers, max_tokens = kv_stages.workload_bodies(args.workload)
    renderer = PromptRenderer.from_dir(default_tokenizer_dir())
    fleet = FakeFleet(*[worker(f"w{k}", model="m", kv_block_size=16, capacity=Capacity(kv_blocks=100000))
                        for k in range(n_workers)])
    ticks = itertools.count(1)
    router = Router(fleet, FakeTransport(), None, renderer, RouterOptions(policy=args.policy), rng=random.Random(1),
                    clock=lambda: 1000.0 + next(ticks) * 1e-4)
    frames: collections.Counter[str] = collections.Counter()
    ops: collections.Counter[str] = collections.Counter()

    tracer = opcode_tracer(lambda frame: f"{frame.f_code.co_filename.split('/')[-1]}:{frame.f_code.co_name}",
                           frames, ops)

    async def run() -> None:
        for i in range(2 * args.n):
            body = bodies[i % len(bodies)]
            req = RouteRequest(kind="chat", path="/v1/chat/completions", body=body, payload=orjson.loads(body),
                               model="m", max_tokens=max_tokens)
            if i >= args.n:
                sys.settrace(tracer)
            routed = await router.dispatch(req, {})
            routed.close()
            sys.settrace(None)

    asyncio.run(run())
    n = args.n
    rows = sorted(((ops[k] / n, frames[k] / n, k) for k in frames), reverse=True)
    print(f"{args.policy} {args.workload}: {sum(r[1] for r in rows):.1f} frames, {sum(r[0] for r in rows):.0f} "
          f"bytecodes a request ({args.root})")
    for o, c, k in rows[:args.top]:
        print(f"  {o:7.1f} bytecodes {c:5.2f} frames  {k}")


if __name__ == "__main__":
    main()
