"""KV events per request on router_overhead.py's workload, and what their ingest costs per request.

Two mock engines (x100000) and one kv-aware frontend; ``--n`` ~1k-token chat requests at concurrency 32,
non-streamed, ``max_tokens`` 8. A second subscriber on each engine's KV-event socket records every batch
the engines publish meanwhile; the script counts batches, events and blocks per request, then replays the
recorded batches in process into a fresh index (decode + ``PrefixIndex.apply``, as the frontend's feed
does) and reports the CPU per batch and per request. The ZMQ receive itself is not in that figure.

    .venv/bin/python bench/kv_events_live.py --n 3000 [--dump /tmp/batches.pkl]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq

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
from harness.zmq_sub import subscribe
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import decode_batch

MODEL = "bench-model"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--dump", help="also write the recorded batches here, for bench/kv_feed_replay.py")
    args = ap.parse_args()
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-kv-events-"))
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir) for i in range(2)]
    front = frontend("kv", tok, "kv-aware", engines, log_dir)
    got: list[tuple[str, bytes]] = []
    stop = threading.Event()
    last = [time.monotonic()]
    ctx = zmq.Context()
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        subs: dict[zmq.Socket[bytes], str] = {}
        for e in engines:
            with urllib.request.urlopen(e.url + "/infera/worker") as r:
                record = json.loads(r.read())
            subs[subscribe(ctx, record["kv_events"]["endpoint"])] = record["instance_id"]

        def pump() -> None:
            poller = zmq.Poller()
            for s in subs:
                poller.register(s, zmq.POLLIN)
            while not stop.is_set():
                for s, _ in poller.poll(100):
                    got.append((subs[s], s.recv_multipart()[2]))
                    last[0] = time.monotonic()

        thread = threading.Thread(target=pump)
        thread.start()
        front.start()
        front.wait_ready("/health", 90, frontend_ready(len(engines)))
        bodies = [chat_body(i, MODEL, False, 8) for i in range(4096)]

        async def load() -> Any:
            async with make_session(32) as session:
                return await run_load(session, [front.url + "/v1/chat/completions"], bodies, 32, args.n, 300.0)

        res = asyncio.run(load())
        while time.monotonic() - last[0] < 0.5:  # the engines' last batches: until none came for 0.5 s
            time.sleep(0.05)
        stop.set()
        thread.join()
    finally:
        stop.set()
        stop_all([front, *engines])
        ctx.destroy(0)
    if args.dump:
        with open(args.dump, "wb") as f:
            pickle.dump(got, f)
    events: Counter[str] = Counter()
    blocks: Counter[str] = Counter()
    for _, payload in got:
        for ev in decode_batch(payload).events:
            events[type(ev).__name__] += 1
            blocks[type(ev).__name__] += len(getattr(ev, "block_hashes", ()))
    ok = max(res.ok, 1)
    print(f"{res.ok} requests ({res.errors} errors): {len(got) / ok:.2f} batches, "
          f"{sum(len(p) for _, p in got) / ok:.0f} bytes per request")
    for kind in sorted(events):
        print(f"  {kind}: {events[kind] / ok:.2f} events, {blocks[kind] / ok:.1f} blocks per request")
    for _ in range(3):
        index = PrefixIndex()
        t0 = time.process_time_ns()
        for wid, payload in got:
            index.apply(wid, decode_batch(payload))
        dt = time.process_time_ns() - t0
        print(f"  decode + apply in process: {dt / max(len(got), 1) / 1e3:.1f} µs per batch, {dt / ok / 1e3:.1f} µs "
              "per request")


if __name__ == "__main__":
    main()
