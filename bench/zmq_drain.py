"""What a KV-event reader's drain of a ZMQ SUB socket costs (issue 15, thirteenth round, helper kvwake15).

Two ways to take every queued 3-frame batch: the source's (``getsockopt(EVENTS)`` before each message,
``getsockopt(RCVMORE)`` after each frame) and Frame reads (``recv(copy=False)``, ``Frame.more`` read in C,
ending at the ``zmq.Again`` of an empty socket). Each drain follows a real wait for its batches (as live: the
reader wakes for them), K batches a drain; thread CPU per drain, 3 rounds.

    .venv/bin/python bench/zmq_drain.py [K]
"""

from __future__ import annotations

import select
import sys
import time
from collections.abc import Callable

import zmq


def main() -> None:
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(0.3)  # the subscription reaches the publisher
    fd = sub.getsockopt(zmq.FD)
    payload = b"x" * 700
    events, pollin, noblock, more, again = zmq.EVENTS, int(zmq.POLLIN), zmq.NOBLOCK, zmq.RCVMORE, zmq.Again

    def options() -> int:
        option, recv, n = sub.getsockopt, sub.recv, 0
        while option(events) & pollin:  # type: ignore[operator]
            frames = [recv(noblock)]
            while option(more):
                frames.append(recv(noblock))
            n += 1
        return n

    def frames() -> int:
        recv, n = sub.recv, 0
        while True:
            try:
                f = recv(noblock, copy=False)
            except again:
                return n
            got = [f]
            while f.more:
                f = recv(noblock, copy=False)
                got.append(f)
            _ = got[1].bytes, got[2].bytes
            n += 1

    ways: list[tuple[str, Callable[[], int]]] = [("options", options), ("frames", frames)]
    for _ in range(3):
        for name, drain in ways:
            total, msgs = 0.0, 0
            for i in range(400):
                for _j in range(k):
                    pub.send_multipart([b"kv", i.to_bytes(8, "big"), payload])
                select.select([fd], [], [], 1)
                time.sleep(0.0005)
                t0 = time.thread_time()
                msgs += drain()
                total += time.thread_time() - t0
            print(f"K={k} {name:8s} {total / 400 * 1e6:7.2f} µs a drain, {msgs / 400:.2f} batches a drain")


if __name__ == "__main__":
    main()
