"""kv-aware's pick and Legs.place in process, split into their calls: where a decision's µs go.

bench/kv_stages.py's ``run_stages`` (routing_quality's workloads through a real Router with fakes at the transport),
with the calls inside the pick (``KvEvictPolicy.score_workers``: the one C call, and the index's methods it calls
back) and inside ``Legs.place`` (``hold``: the load ticket, the index's prediction, the overlap statistic) wrapped in
wall-clock timers (~0.1 µs each), after the warm-up. ``--thrash MB`` copies that much memory between requests
(untimed), so the caches are as cold as a live frontend's between two decisions (16: the stages' µs near
quality_cpu_split --timers' on a quiet box). Each line gives the mean and, robust to a busy box's preemptions (a shared
box's means move by a third between runs of the same tree), the median of the calls' wall µs. A call made from C
without a Python attribute in between (the shadow's ``recency_touch``, the walk inside ``overlaps_and_confirmed``
taken in C) is within its caller's figure.

    PYTHONPATH=$PWD .venv/bin/python bench/pick_steps.py --workload tenants --thrash 16
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="tenants", choices=("chats", "tenants", "multiturn"))
    ap.add_argument("--policy", default="kv-aware")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=600)
    ap.add_argument("--thrash", type=float, default=16.0, metavar="MB")
    args = ap.parse_args()

    from bench import kv_stages
    from infera.kv import index as index_mod
    from infera.kv import index_tables, load
    from infera.router import kv_evict, legs, pick

    spent: collections.Counter[str] = collections.Counter()
    each: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
    calls: collections.Counter[str] = collections.Counter()
    on = [False]
    now = time.perf_counter_ns

    def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = now()
            try:
                return f(*a, **k)
            finally:
                if on[0]:
                    dt = now() - t
                    spent[name] += dt
                    each[name].append(dt)
                    calls[name] += 1
        return wrapper

    picks = [0]
    inner_pick = timed("pick (Picker.pick)", pick.Picker.pick)

    def counted_pick(*a: Any, **k: Any) -> Any:
        picks[0] += 1
        on[0] = picks[0] > args.warmup
        return inner_pick(*a, **k)

    patches: list[tuple[Any, str, Callable[..., Any]]] = [
        (pick.Picker, "pick", counted_pick),
        (kv_evict.KvEvictPolicy, "score_workers",
         timed("pick: score_workers (kv_decide)", kv_evict.KvEvictPolicy.score_workers)),
        (index_mod.PrefixIndex, "holding", timed("pick: - PrefixIndex.holding", index_mod.PrefixIndex.holding)),
        (index_mod.PrefixIndex, "overlaps_and_confirmed",
         timed("pick: - PrefixIndex.overlaps_and_confirmed", index_mod.PrefixIndex.overlaps_and_confirmed)),
        (legs.Legs, "place", timed("legs.place", legs.Legs.place)),
        # on the C path a leg's hold is one C call (legs_hold, issue 15's sixteenth round): within legs.place's figure
        (legs.Legs, "_hold", timed("legs.place: hold (Legs' lines, off the C path)", legs.Legs._hold)),
        (index_mod.PrefixIndex, "predict", timed("legs.place: - PrefixIndex.predict", index_mod.PrefixIndex.predict)),
        (index_tables.Predictions, "add", timed("legs.place: - - Predictions.add", index_tables.Predictions.add)),
        (pick.RouterStats, "observe_overlap",
         timed("legs.place: - observe_overlap", pick.RouterStats.observe_overlap)),
    ]
    for owner, name, f in patches:
        setattr(owner, name, f)
    tracker_init = load.LoadTracker.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        tracker_init(self, *a, **k)
        self.begin = timed("legs.place: - LoadTracker.begin", self.begin)

    load.LoadTracker.__init__ = init  # type: ignore[method-assign]
    stages = kv_stages.run_stages(args.policy, args.n, args.warmup, 100000, args.workload, True, args.thrash)
    print(f"{args.workload} {args.policy}, thrash {args.thrash:g} MB: kv_stages' pick {stages['pick']:.1f}, legs "
          f"{stages['legs']:.1f} µs/request (CPU, with these timers)")
    for name in sorted(spent):
        print(f"  {name:48s} {spent[name] / args.n / 1e3:7.1f} µs/request  {calls[name] / args.n:5.2f} calls/request"
              f"  median {statistics.median(each[name]) / 1e3:6.1f} µs/call")


if __name__ == "__main__":
    main()
