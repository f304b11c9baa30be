"""A soak: ``python -m bench.soak --minutes 30`` (issue 19, part 3).

Three mock engines behind ``infera.server`` on etcd/http/zmq take the faults suite's open-loop mix
at a fixed rate for ``--minutes``; every ``--churn-minutes`` the oldest worker is retired (SIGTERM:
it deregisters and drains) and a new one joins under a new id. Every ``--sample-seconds`` the
frontend's RSS and open file descriptors are sampled, with the router's state for departed workers:
worker ids still named in ``/metrics`` or ``/v1/workers`` that are no longer in the fleet.
Targets: < 5 % growth of RSS and fds from the end of the warm-up (the first sample at or after
``--warmup-minutes``) to the end, and no state kept for departed workers. Writes the samples to
bench/results/ and a plot to bench/plots/soak.png; the open fds at the start and end are listed by
target so growth can be attributed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import PLOTS, PYTHON, default_tokenizer_dir, machine_info, write_results
from bench.fault_fleet import Fleet
from bench.fault_load import Load, tally
from harness import get_json, scrape


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fd_targets(pid: int) -> Counter[str]:
    """Open fds of ``pid`` by kind of target (socket, pipe, anon_inode:[eventpoll], a file path)."""
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            kinds[target.split(":[")[0] if ":[" in target and not target.startswith("anon") else target] += 1
    return kinds


def departed_state(fleet: Fleet, departed: set[str]) -> dict[str, int]:
    """How many departed worker ids the frontend still names, in /metrics and in /v1/workers."""
    from prometheus_client.parser import text_string_to_metric_families

    in_metrics = {s.labels.get("worker") for f in text_string_to_metric_families(scrape(fleet.frontend.url))
                  for s in f.samples} & departed
    in_view = {w["instance_id"] for w in get_json(fleet.frontend.url + "/v1/workers")["data"]} & departed
    return {"metrics": len(in_metrics), "view": len(in_view)}


def growth(samples: list[dict[str, Any]], key: str, warmup_s: float) -> float:
    base = next((s for s in samples if s["t"] >= warmup_s), samples[0])
    return (samples[-1][key] - base[key]) / base[key] * 100.0 if base[key] else 0.0


def plot(samples: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t"] / 60 for s in samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    ax1.plot(minutes, [s["rss_kib"] / 1024 for s in samples], marker=".", color="tab:blue")
    ax1.set_ylabel("frontend RSS (MiB)")
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax2.plot(minutes, [s["fds"] for s in samples], marker=".", color="tab:orange", label="open fds")
    ax2.plot(minutes, [s["ok_per_s"] for s in samples], marker=".", color="tab:green", label="ok req/s")
    ax2.set_ylabel("count")
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("minutes")
    ax2.legend(loc="lower right")
    ax2.grid(alpha=0.3)
    for s in samples:
        if s.get("churn"):
            for ax in (ax1, ax2):
                ax.axvline(s["t"] / 60, color="grey", alpha=0.3, linestyle="--")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def soak(minutes: float, rate: float, churn_minutes: float, sample_s: float, warmup_minutes: float, tmp: Path,
         python: str = PYTHON, log: Any = print, fleet: Fleet | None = None) -> dict[str, Any]:
    """The soak on ``fleet`` (an etcd-plane fleet already serving, left running) or on a new one."""
    owned = fleet is None
    fleet = fleet or Fleet("etcd", tmp, default_tokenizer_dir(), python=python)
    n = int(minutes * 60 * rate)
    load = Load("", "mock-model", n, rate, deadline=60.0)
    samples: list[dict[str, Any]] = []
    departed: set[str] = set()
    stop = threading.Event()
    churned: list[str] = []

    events: list[str] = []  # churns since the last sample

    def churner() -> None:
        next_churn = churn_minutes * 60
        last_churn = minutes * 60 - min(60.0, minutes * 15)  # none in the last minute (quarter, if short)
        while not stop.wait(1.0):
            t = load.elapsed()
            if t < next_churn or t >= last_churn:
                continue
            next_churn += churn_minutes * 60
            try:
                old, new = fleet.churn()
            except Exception as exc:  # a failed churn is a finding, not a crash of the soak
                events.append(f"failed: {exc}"[:200])
                continue
            departed.add(old)
            churned.append(f"{old}->{new}")
            events.append(f"{old}->{new}")

    def sampler() -> None:
        pid = fleet.frontend.pid
        last_t, last_ok = 0.0, 0
        while not stop.wait(sample_s):
            t = load.elapsed()
            ok = sum(1 for r in load.results if r.outcome == "ok" and r.took)
            try:
                state = departed_state(fleet, departed)
            except OSError:
                state = {"metrics": -1, "view": -1}
            churn = ", ".join(events)
            events.clear()
            sample = {"t": round(t, 1), "rss_kib": rss_kib(pid), "fds": len(os.listdir(f"/proc/{pid}/fd")),
                      "ok": ok, "ok_per_s": round((ok - last_ok) / max(1e-9, t - last_t), 2),
                      "in_flight": load.in_flight(), "departed_in_metrics": state["metrics"],
                      "departed_in_view": state["view"], "churn": churn}
            last_t, last_ok = t, ok
            samples.append(sample)
            log(f"t={t / 60:5.1f}m rss={sample['rss_kib'] / 1024:.1f}MiB fds={sample['fds']} ok={ok} "
                f"({sample['ok_per_s']}/s) departed state={state} {churn}", flush=True)

    try:
        if owned:
            fleet.start()
        load.base = fleet.frontend.url
        fds_start = fd_targets(fleet.frontend.pid)
        threads = [threading.Thread(target=f, daemon=True) for f in (sampler, churner)]
        for thread in threads:
            thread.start()
        results = asyncio.run(load.run())
        stop.set()
        for thread in threads:
            thread.join(120)
        fds_end = fd_targets(fleet.frontend.pid)
    finally:
        stop.set()
        if owned:
            fleet.stop()
    warmup = warmup_minutes * 60
    fd_diff = {k: fds_end.get(k, 0) - fds_start.get(k, 0) for k in set(fds_start) | set(fds_end)
               if fds_end.get(k, 0) != fds_start.get(k, 0)}
    return {"outcomes": tally(results), "samples": samples, "churned": churned,
            "rss_growth_pct": round(growth(samples, "rss_kib", warmup), 2),
            "fds_growth_pct": round(growth(samples, "fds", warmup), 2),
            "fds_start": dict(fds_start), "fds_end": dict(fds_end), "fds_diff": fd_diff,
            "problems": sorted(Counter(f"{r.outcome}: {r.detail[:90]}" for r in results
                                       if r.outcome != "ok").items(), key=lambda kv: -kv[1])[:8]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=8.0, help="requests per second (open loop)")
    ap.add_argument("--churn-minutes", type=float, default=3.0, help="minutes between worker replacements")
    ap.add_argument("--sample-seconds", type=float, default=60.0)
    ap.add_argument("--warmup-minutes", type=float, default=2.0)
    ap.add_argument("--plot", default=str(PLOTS / "soak.png"), help="where to draw the plot ('' = none)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="infera-soak-") as tmp:
        out = soak(args.minutes, args.rate, args.churn_minutes, args.sample_seconds, args.warmup_minutes, Path(tmp))
    out["machine"], out["args"] = machine_info(), vars(args)
    out["wall_s"] = round(time.monotonic() - started, 1)
    path = write_results("soak", out)
    if args.plot and out["samples"]:
        plot(out["samples"], Path(args.plot), f"soak: {args.minutes:g} min at {args.rate:g} req/s, "
                                              f"a worker replaced every {args.churn_minutes:g} min")
    print(f"outcomes {out['outcomes']}\nRSS growth after warm-up {out['rss_growth_pct']} %, "
          f"fds {out['fds_growth_pct']} %\nfd kinds that changed: {out['fds_diff']}\nproblems {out['problems']}\n"
          f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
