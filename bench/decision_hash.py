"""A digest of every decision kv_stages.run_stages makes under its virtual clock: two trees that decide alike print
the same digests (a change meant to keep kv-aware's decisions, checked end to end on routing_quality's workloads).

Each decision's chosen worker, cost (its hex, to the bit), reason and overlap, and the predictions left after each
prune (entries, hashes, the sum of their masks), in order, through sha256; per workload
(tenants, multiturn, chats), with the workers' caches large and small (``--kv-blocks``: the LRU's evictions applied),
and with ``--ttl`` the predictions expiring as the run goes; kv-aware's, or with ``--policies`` each policy's named
(round-robin and kv-aware-blocks: Picker's ties and their tie-break, which kv-aware's costs rarely reach). Each run is a
fresh process with ``--root``'s infera first on the path (this tree's by default).

    PYTHONPATH=$PWD .venv/bin/python bench/decision_hash.py --root /tmp/ref_tree
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CHILD = """
import hashlib, sys
sys.path.insert(0, {root!r})
from infera.router import legs, pick
if {ttl!r} is not None:
    legs.PREDICTION_TTL = {ttl!r}  # read when a router is made (Legs), or at each hold
from bench import kv_stages
digest, count, inner = hashlib.sha256(), [0], pick.Picker.pick
def recorded(self, ctx, workers, policy, name):
    choice = inner(self, ctx, workers, policy, name)
    w, cost = choice.worker.instance_id, float(choice.cost).hex()
    digest.update(f"{{w}} {{cost}} {{choice.reason}} {{choice.overlap}};".encode())
    count[0] += 1
    return choice
pick.Picker.pick = recorded
from infera.kv import index_tables
pruned, inner_prune = [0], index_tables.Predictions.prune
def pruning(self, now, workers):  # the predictions left after each prune, in the digest too
    inner_prune(self, now, workers)
    pruned[0] += 1
    digest.update(f"{{len(self.heap)}} {{len(self.masks)}} {{sum(self.masks.values())}};".encode())
index_tables.Predictions.prune = pruning
kv_stages.run_stages({policy!r}, {n}, {warmup}, {kv_blocks}, {workload!r}, True)
print(count[0], "decisions", pruned[0], "prunes", digest.hexdigest()[:16])
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--workloads", default="tenants,multiturn,chats")
    ap.add_argument("--kv-blocks", default="100000,1000")
    ap.add_argument("--policies", default="kv-aware", help="comma-separated --router-policy names")
    ap.add_argument("--ttl", type=float, default=None,
                    help="the predictions' TTL in virtual seconds (the clock moves 100 µs a reading, ~1 ms a request: "
                         "0.05 expires them ~50 requests on, so their prune runs), default legs.PREDICTION_TTL")
    args = ap.parse_args()
    for policy in args.policies.split(","):
        for workload in args.workloads.split(","):
            for kv_blocks in (int(k) for k in args.kv_blocks.split(",")):
                code = CHILD.format(root=args.root, n=args.n, warmup=args.warmup, kv_blocks=kv_blocks,
                                    workload=workload, ttl=args.ttl, policy=policy)
                out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                     cwd=args.root)
                print(f"{policy:15} {workload:10} kv-blocks {kv_blocks:6}: {out.stdout.strip().splitlines()[-1]}",
                      flush=True)


if __name__ == "__main__":
    main()
