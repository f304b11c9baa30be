"""KV-event intake over ZMQ, a git ref's ``ZmqEventSource`` against this tree's, in one process.

A PUB socket on loopback sends ~1.1 kB batches one at a time, each waited for at the sink before the
next (the live case: engines publish about one batch per request, so the subscriber wakes for each);
the sink only counts (no decoding: the transport's cost alone, plus the sender's and the wait's, which
are the same both ways). Process CPU per batch, the two sources interleaved over ``--rounds``; the
ratio per round (the two runs of a round are seconds apart, so they met the same load) and its median.

    .venv/bin/python bench/zmq_intake_ab.py --ref main
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop
import zmq
import zmq.asyncio

from infera.protocols.kv_events import seq_to_bytes
from infera.protocols.worker import KvEventEndpoint, WorkerRecord

REPO = Path(__file__).resolve().parent.parent


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.deliver = lambda wid, payload, sink, gap: sink(wid, payload)  # type: ignore[attr-defined]
    return module


async def _one(module: Any, pub: zmq.asyncio.Socket, port: int, n: int, payload: bytes) -> float:
    got: list[bytes] = []
    arrived = asyncio.Event()

    def sink(worker_id: str, batch: bytes) -> None:
        got.append(batch)
        arrived.set()

    source = module.ZmqEventSource()
    source.bind(sink, lambda worker_id, lost: None)
    await source.start()
    source.watch(WorkerRecord(instance_id="w", model="m", http_url="http://x",
                              kv_events=KvEventEndpoint(endpoint=f"tcp://127.0.0.1:{port}", topic="t")))
    while not got:  # until the subscription is through (each try is one batch, seq 0 again: applied once)
        await pub.send_multipart([b"t", seq_to_bytes(0), payload])
        await asyncio.wait([asyncio.ensure_future(arrived.wait())], timeout=0.01)
    got.clear()
    c0 = time.process_time_ns()
    for i in range(n):
        arrived.clear()
        await pub.send_multipart([b"t", seq_to_bytes(1 + i), payload])
        while len(got) < i + 1:
            arrived.clear()
            await arrived.wait()
    cpu = (time.process_time_ns() - c0) / n / 1e3
    await source.stop()
    return cpu


async def _main(args: argparse.Namespace, before: ModuleType, after: ModuleType) -> None:
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    payload = os.urandom(1100)
    out: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = [("before", before), ("after", after)] if r % 2 == 0 else [("after", after), ("before", before)]
        for name, module in order:
            out[name].append(await _one(module, pub, port, args.n, payload))
    pub.close(0)
    ctx.destroy(0)
    b, a = statistics.median(out["before"]), statistics.median(out["after"])
    ratios = [y / x for x, y in zip(out["before"], out["after"], strict=True)]
    print(f"{args.ref}: {[round(x) for x in out['before']]}  this tree: {[round(x) for x in out['after']]} µs/batch")
    print(f"median {args.ref} {b:.1f}, this tree {a:.1f} µs per batch; per round this tree / {args.ref}: "
          f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}×)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--n", type=int, default=3000)
    args = ap.parse_args()
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{args.ref}:infera/transport/zmq_events.py"], check=True,
                         capture_output=True).stdout
    with tempfile.NamedTemporaryFile("wb", suffix=".py", delete=False) as f:
        f.write(src)
    before = _load(Path(f.name), "zmq_events_ref")
    after = _load(REPO / "infera" / "transport" / "zmq_events.py", "zmq_events_tree")
    os.unlink(f.name)
    uvloop.run(_main(args, before, after))


if __name__ == "__main__":
    main()
