"""The live KV-event sink's CPU per batch, replayed in process: what the frontend does with each batch its
ZMQ reader takes (``deliver``: ``IndexFeed.on_payload`` where the tree has it and the index takes the batch from its
bytes, else decode, then ``IndexFeed.on_batch``: ``PrefixIndex.apply`` and the feed's bookkeeping), on batches
recorded from a live run by ``bench/kv_events_live.py --dump``.

Run it under two trees' PYTHONPATH, alternating, to compare them on the same batches:

    .venv/bin/python bench/kv_events_live.py --n 2000 --dump /tmp/batches.pkl
    PYTHONPATH=/tmp/ref .venv/bin/python bench/kv_feed_replay.py /tmp/batches.pkl
    PYTHONPATH=$PWD .venv/bin/python bench/kv_feed_replay.py /tmp/batches.pkl
"""

from __future__ import annotations

import argparse
import pickle
import time
from typing import Any, cast

from infera.discovery.base import WorkerTable
from infera.kv.feed import IndexFeed
from infera.kv.index import PrefixIndex
from infera.transport.delivery import deliver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("batches")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with open(args.batches, "rb") as f:
        got: list[tuple[str, bytes]] = pickle.load(f)
    best = float("inf")
    for _ in range(args.repeat):
        feed = IndexFeed(cast(Any, WorkerTable()), None, PrefixIndex())
        sink, gap = feed.on_batch, feed.on_gap
        # the raw sink as IndexFeed binds it (a tree before it has neither; its deliver takes four arguments)
        raw = feed.on_payload if getattr(feed.index, "takes_payloads", False) else None
        t0 = time.process_time_ns()
        if raw is None:
            for wid, payload in got:
                deliver(wid, payload, sink, gap)
        else:
            for wid, payload in got:
                deliver(wid, payload, sink, gap, raw)
        best = min(best, (time.process_time_ns() - t0) / max(len(got), 1) / 1e3)
    path = "on_payload / on_batch" if raw is not None else "on_batch"
    print(f"{len(got)} batches: deliver + IndexFeed.{path} {best:.2f} µs per batch (best of {args.repeat})")


if __name__ == "__main__":
    main()
