"""A decision's KV-event catch-up over ZMTP, split by part (issue 15, helper intake18).

A publisher process (bench/zmtp_intake.py's, a libzmq PUB as vLLM's) sends ``--rate`` batches a second of ``--blocks``
stored blocks each (9: routing_quality's tenants, ~22 new blocks a request in ~2.5 batches); this process follows it
with the real ZmqEventSource, IndexFeed and PrefixIndex (the C drain, ``drain_stream``), and a "decision" calls
``catch_up`` every ``--every`` seconds (the loop sleeps in between, as the live frontend's does between requests). For
each catch-up that applied something, in wall time (a vDSO clock: ~0.1 µs a read): the whole ``catch_up``, the
private epoll's ``poll``, ``IndexFeed.on_stream`` (the feed's part), ``PrefixIndex.drain_stream`` and the C call
alone; medians. Wall time is CPU time here (no call blocks) unless the thread is preempted (medians).

    PYTHONPATH=$PWD .venv/bin/python bench/zmtp_catchup_split.py [--rate 60 --blocks 9 --every 0.025 --decisions 400]
        [--whole]

On a tree whose catch-up is one C call (``PrefixIndex.drain_ready``, helper catchup18) the parts are: ``on_stream``
the feed's ``on_ready``, ``drain_stream`` the index's ``drain_ready``, ``C`` its C call (the epoll_wait in it: ``poll``
is 0). ``--whole`` times only ``catch_up`` (wall and thread CPU), nothing patched: the A/B between trees.

``strace -e trace=recvfrom,epoll_wait`` of it counts the syscalls a catch-up makes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from zmtp_intake import PUBLISHER

from infera.discovery.base import FleetChange
from infera.kv.feed import IndexFeed
from infera.kv.index import PrefixIndex
from infera.protocols.worker import KvEventEndpoint, WorkerRecord
from infera.transport.zmq_events import ZmqEventSource


class OneWorker:
    """A fleet of one worker that never changes."""

    def __init__(self, worker: WorkerRecord) -> None:
        self.worker = worker

    def subscribe(self, callback: Callable[[FleetChange], None]) -> None:
        pass

    def workers(self) -> dict[str, WorkerRecord]:
        return {self.worker.instance_id: self.worker}


class TimedPoll:
    """The source's epoll with its ``poll`` timed (the rest passed through)."""

    def __init__(self, poller: select.epoll, out: list[int]) -> None:
        self.poller, self.out = poller, out

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        t0 = time.perf_counter_ns()
        got = self.poller.poll(timeout)
        self.out.append(time.perf_counter_ns() - t0)
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self.poller, name)


def timed(fn: Callable[..., Any], out: list[int]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            out.append(time.perf_counter_ns() - t0)
    return call


async def run(port: int, every: float, decisions: int, whole: bool) -> dict[str, float]:
    index = PrefixIndex(block_size=16)
    source = ZmqEventSource()
    worker = WorkerRecord(instance_id="w1", model="m", http_url="http://w1.invalid", kv_block_size=16,
                          kv_events=KvEventEndpoint(endpoint=f"tcp://127.0.0.1:{port}", topic="kv-events"))
    feed = IndexFeed(OneWorker(worker), source, index)  # type: ignore[arg-type]
    await source.start()
    await feed.start()
    parts: dict[str, list[int]] = {k: [] for k in ("catch_up", "poll", "on_stream", "drain_stream", "C")}
    if whole:
        parts = {"catch_up": [], "catch_up CPU": []}
    try:
        while sum(feed.batches.values()) < 20:  # connected, the worker known, the stream flowing
            source.catch_up()
            await asyncio.sleep(0.01)
        (link,) = source._subs
        assert source._poller is not None
        poller = source._poller
        if whole:
            pass
        elif getattr(index, "_ready", None) is not None and source._streams:  # type: ignore[attr-defined]
            index._ready = timed(index._ready, parts["C"])  # type: ignore[attr-defined]
            index.drain_ready = timed(index.drain_ready, parts["drain_stream"])  # type: ignore[method-assign]
            source._ready_sink = timed(source._ready_sink, parts["on_stream"])  # type: ignore[attr-defined]
            parts["poll"].append(0)
        else:
            index._stream = timed(index._stream, parts["C"])  # type: ignore[attr-defined]
            index.drain_stream = timed(index.drain_stream, parts["drain_stream"])  # type: ignore[method-assign]
            link._sink = timed(link._sink, parts["on_stream"])  # type: ignore[union-attr]
            source._poller = TimedPoll(poller, parts["poll"])  # type: ignore[assignment]
        ready_path = not whole and bool(parts["poll"])
        rows: list[dict[str, float]] = []
        batches: list[int] = []
        for _ in range(decisions):
            await asyncio.sleep(every)
            for v in parts.values():
                v.clear()
            if ready_path:
                parts["poll"].append(0)
            b0 = sum(feed.batches.values())
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            source.catch_up()
            parts["catch_up"].append(time.perf_counter_ns() - t0)
            if whole:
                parts["catch_up CPU"].append(time.thread_time_ns() - c0)
            if sum(feed.batches.values()) > b0 and (whole or len(parts["C"]) == 1):
                rows.append({k: v[0] / 1e3 for k, v in parts.items()})
                batches.append(sum(feed.batches.values()) - b0)
        source._poller = poller
    finally:
        await source.stop()
    out = {k: statistics.median(r[k] for r in rows) for k in parts}
    out["catch-ups"] = len(rows)
    out["batches"] = statistics.mean(batches)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=60.0, help="batches a second")
    ap.add_argument("--blocks", type=int, default=9, help="stored blocks a batch")
    ap.add_argument("--every", type=float, default=0.025, help="seconds between two decisions")
    ap.add_argument("--decisions", type=int, default=400)
    ap.add_argument("--whole", action="store_true", help="time only catch_up (wall and thread CPU)")
    args = ap.parse_args()
    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(args.rate), str(args.blocks)],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert pub.stdout is not None
        got = asyncio.run(run(int(pub.stdout.readline()), args.every, args.decisions, args.whole))
    finally:
        pub.kill()
        pub.wait()
    print(f"{time.strftime('%H:%M:%S UTC', time.gmtime())} load {os.getloadavg()[0]:.1f}: "
          f"{got.pop('catch-ups'):.0f} catch-ups that applied {got.pop('batches'):.2f} batches; wall µs (medians): "
          + ", ".join(f"{k} {v:.1f}" for k, v in got.items()))


if __name__ == "__main__":
    main()
