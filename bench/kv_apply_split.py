"""The KV-event sink's two pieces apart, per batch: ``decode_batch`` alone, then ``PrefixIndex.apply`` alone on
those freshly decoded batches (a new index each round), best of N rounds of CPU time; on batches recorded by
``bench/kv_events_live.py --dump``. Run it under two trees' PYTHONPATH, alternating (see kv_feed_replay.py):

    PYTHONPATH=$PWD .venv/bin/python bench/kv_apply_split.py /tmp/batches.pkl --repeat 15
"""

from __future__ import annotations

import argparse
import pickle
import time

from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import decode_batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("batches")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with open(args.batches, "rb") as f:
        got: list[tuple[str, bytes]] = pickle.load(f)
    n = max(len(got), 1)
    dec = app = float("inf")
    for _ in range(args.repeat):
        t0 = time.process_time_ns()
        batches = [(wid, decode_batch(payload)) for wid, payload in got]
        dec = min(dec, (time.process_time_ns() - t0) / n / 1e3)
        index = PrefixIndex()
        t0 = time.process_time_ns()
        for wid, batch in batches:
            index.apply(wid, batch)
        app = min(app, (time.process_time_ns() - t0) / n / 1e3)
    print(f"{len(got)} batches: decode_batch {dec:.2f}, PrefixIndex.apply {app:.2f} µs per batch "
          f"(best of {args.repeat})")


if __name__ == "__main__":
    main()
