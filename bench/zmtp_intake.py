"""The KV-event intake's CPU in the frontend process: libzmq's SUB socket against the ZMTP reader (issue 15, zmtp17).

A publisher process (a libzmq PUB, as vLLM's) sends ``--rate`` batches a second, each as a live request's
(``--blocks`` stored blocks of 16 tokens; every other one removes the blocks of an older one). This process follows it
with the real ZmqEventSource and a PrefixIndex (the C drain: ``drain_socket`` over libzmq, ``drain_stream`` over ZMTP)
while "decisions" call ``catch_up`` ``--decisions`` times a second, as routing does. For ``--seconds`` per arm, arms
alternating over ``--rounds``: the process's CPU (every thread: the loop's and libzmq's I/O thread), the loop
thread's, and voluntary context switches (wake-ups), per batch. The decisions' own timer wake-ups are in both arms.

    PYTHONPATH=$PWD .venv/bin/python bench/zmtp_intake.py [--rate 260 --decisions 100 --seconds 6 --rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from infera.kv.index import PrefixIndex
from infera.protocols.worker import KvEventEndpoint, WorkerRecord
from infera.transport.zmq_events import ZmqEventSource

PUBLISHER = r"""
import sys, time, zmq
from infera.protocols.kv_events import BlockRemoved, BlockStored, EventBatch, encode_batch, seq_to_bytes
rate, blocks = float(sys.argv[1]), int(sys.argv[2])
ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB)
pub.setsockopt(zmq.SNDHWM, 100000)
print(pub.bind_to_random_port("tcp://127.0.0.1"), flush=True)
seq, nxt, held = 0, 1, []
subscribed = 0
def payload():
    global nxt
    hashes = list(range(nxt, nxt + blocks)); nxt += blocks
    events = [BlockStored(block_hashes=hashes, parent_block_hash=None,
                          token_ids=[(h * 7 + j) % 50000 for h in hashes for j in range(16)], block_size=16)]
    held.append(hashes)
    if seq % 2 and len(held) > 8:
        events.append(BlockRemoved(block_hashes=held.pop(0)))
    return encode_batch(EventBatch(ts=time.time(), events=events))
while True:  # a subscriber at a time; each gets the stream until it goes
    got = pub.recv()
    if got[:1] != b"\x01":
        continue
    start, k = time.monotonic(), 0
    while not pub.poll(0):
        pub.send_multipart([b"kv-events", seq_to_bytes(seq), payload()])
        seq += 1
        k += 1
        time.sleep(max(0.0, start + k / rate - time.monotonic()))
"""


def cpu() -> tuple[float, float, int]:
    """(process CPU s, the calling thread's CPU s, voluntary context switches of every thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    switches = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    switches += int(line.split()[1])
    return r.ru_utime + r.ru_stime, time.thread_time(), switches


async def arm(port: int, zmtp: bool, decisions: float, seconds: float) -> dict[str, float]:
    index = PrefixIndex(block_size=16)
    source = ZmqEventSource(zmtp=zmtp)
    batches = [0]

    def on_batch(wid: str, batch: Any) -> None:
        index.apply(wid, batch)
        batches[0] += 1

    def on_payload(wid: str, payload: bytes) -> bool:
        if index.apply_payload(wid, payload):
            batches[0] += 1
            return True
        return False

    def counted(got: tuple[int, int | None, int, Any] | None) -> tuple[int, int | None, Any] | None:
        if got is None:
            return None
        status, expected, n, extra = got
        batches[0] += n
        return status, expected, extra

    source.bind(on_batch, lambda w, n: None, on_payload,
                lambda w, h, e: counted(index.drain_socket(w, h, e)),
                lambda w, fd, buf, e: counted(index.drain_stream(w, fd, buf, e)))
    await source.start()
    source.watch(WorkerRecord(instance_id="w1", model="m", http_url="http://w1.invalid", kv_block_size=16,
                              kv_events=KvEventEndpoint(endpoint=f"tcp://127.0.0.1:{port}", topic="kv-events")))
    try:
        while batches[0] < 50:  # connected, the index knows the worker, the stream flows
            source.catch_up()
            await asyncio.sleep(0.01)
        step = 1.0 / decisions
        c0, t0, s0, b0 = *cpu(), batches[0]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            source.catch_up()
            await asyncio.sleep(step)
        c1, t1, s1, b1 = *cpu(), batches[0]
    finally:
        await source.stop()
    n = b1 - b0
    return {"batches": n, "cpu_us": (c1 - c0) / n * 1e6, "loop_us": (t1 - t0) / n * 1e6,
            "other_us": ((c1 - c0) - (t1 - t0)) / n * 1e6, "wakes": (s1 - s0) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=260.0, help="batches a second")
    ap.add_argument("--decisions", type=float, default=100.0, help="catch_up calls a second")
    ap.add_argument("--blocks", type=int, default=30, help="stored blocks a batch")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    results: dict[str, list[dict[str, float]]] = {"libzmq": [], "zmtp": []}
    for r in range(args.rounds):
        for name in (("libzmq", "zmtp") if r % 2 == 0 else ("zmtp", "libzmq")):
            pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(args.rate), str(args.blocks)],
                                   stdout=subprocess.PIPE, text=True, env=env)
            try:
                assert pub.stdout is not None
                port = int(pub.stdout.readline())
                got = asyncio.run(arm(port, name == "zmtp", args.decisions, args.seconds))
            finally:
                pub.kill()
                pub.wait()
            results[name].append(got)
            print(f"round {r} {name:7s} " + " ".join(f"{k} {v:.1f}" for k, v in got.items()), flush=True)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} load {os.getloadavg()[0]:.1f}; rate "
          f"{args.rate:g}/s, decisions {args.decisions:g}/s, {args.blocks} blocks a batch; medians of {args.rounds}")
    print("arm      CPU µs/batch  loop thr  other thr  wakes/batch")
    for name, rows in results.items():
        med = {k: statistics.median(row[k] for row in rows) for k in ("cpu_us", "loop_us", "other_us", "wakes")}
        print(f"{name:8s} {med['cpu_us']:12.1f} {med['loop_us']:9.1f} {med['other_us']:10.1f} {med['wakes']:12.2f}")


if __name__ == "__main__":
    main()
