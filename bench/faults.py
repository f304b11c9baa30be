"""Faults under a steady open-loop load: ``python -m bench.faults`` (issue 19, part 1).

For each plane (static/http/zmq, etcd/http/zmq, etcd/nats/nats) a fleet of mock engines behind
``infera.server`` takes an open-loop mix of streamed and non-streamed OpenAI chat and Anthropic
messages (short, medium and long prompts); a third of the way in, one fault is injected. Per cell:
requests sent, ok, clean errors, refused connections, lost (no answer and no error), hung (past the
client's deadline), duplicated work (request ids the engines saw more than once), retries, seconds
until the fleet is full again and every request succeeds, and the frontend's in-flight gauge after
the run (must be 0). Every loop is bounded in count and time.

    python -m bench.faults                       # every plane and scenario, 300 requests each
    python -m bench.faults --planes static --scenarios worker-kill,worker-hang --requests 100
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import PYTHON, default_tokenizer_dir, machine_info, write_results
from bench.fault_fleet import PLANE_NAMES, PLANES, TIMEOUT_S, Fleet, HealthWatch
from bench.fault_load import Load, Result, tally
from harness import metric, scrape, wait_until

FAULT_HOLD_S = 2 * TIMEOUT_S  # a transient fault (hang, slowdown, stall) lasts this long


@dataclasses.dataclass
class Injected:
    """What an injection did: when (seconds into the load) and the ledgers of processes it replaced."""

    at: float = 0.0
    ledgers: list[dict[str, int]] = dataclasses.field(default_factory=list)
    abort_window: tuple[float, float] | None = None


Inject = Callable[[Fleet, Callable[[], float], Injected], None]


def _hold(**knobs: Any) -> Inject:
    def inject(f: Fleet, now: Callable[[], float], out: Injected) -> None:
        w = f.workers[0]
        out.at = now()
        f.fault(w, **knobs)
        time.sleep(FAULT_HOLD_S)
        f.clear_faults()
    return inject


def worker_signal(sig: signal.Signals) -> Inject:
    def inject(f: Fleet, now: Callable[[], float], out: Injected) -> None:
        w = f.workers[0]
        out.ledgers += f.ledgers([w])
        out.at = now()
        f.signal(w, sig)
        if sig == signal.SIGKILL:
            time.sleep(2.0)  # a supervisor's restart delay
        f.restart(w)
        f.wait_worker(w)
    return inject


def etcd_restart(f: Fleet, now: Callable[[], float], out: Injected) -> None:
    assert f.etcd is not None
    out.at = now()
    f.etcd.restart()


def etcd_lease_loss(f: Fleet, now: Callable[[], float], out: Injected) -> None:
    out.at = now()
    f.revoke_lease("w0")


def nats_restart(f: Fleet, now: Callable[[], float], out: Injected) -> None:
    assert f.nats is not None
    out.at = now()
    f.nats.restart()


def frontend_term(f: Fleet, now: Callable[[], float], out: Injected) -> None:
    out.at = now()
    f.signal(f.frontend, signal.SIGTERM)
    f.restart(f.frontend)
    f.frontend.wait_until(f.full, 60, "serving its fleet again")


def client_abort(f: Fleet, now: Callable[[], float], out: Injected) -> None:
    out.at = now()  # the load itself leaves the streams sent in the abort window


SCENARIOS: dict[str, tuple[tuple[str, ...], Inject]] = {
    "worker-kill": (PLANES, worker_signal(signal.SIGKILL)),
    "worker-term": (PLANES, worker_signal(signal.SIGTERM)),
    "worker-hang": (PLANES, _hold(hang=True)),
    "worker-slow": (PLANES, _hold(slowdown=10)),
    "kv-stall": (PLANES, _hold(kv_events_paused=True)),
    "etcd-restart": (("etcd", "nats"), etcd_restart),
    "etcd-lease-loss": (("etcd", "nats"), etcd_lease_loss),
    "nats-restart": (("nats",), nats_restart),
    "frontend-term": (PLANES, frontend_term),
    "client-abort": (PLANES, client_abort),
}


def retries(fleet: Fleet) -> float:
    try:
        return metric(scrape(fleet.frontend.url), "infera_request_retries_total")
    except OSError:
        return 0.0


def engines_busy(fleet: Fleet) -> float:
    """Requests the engines still run or queue (after a run: 0, or work leaked on an engine)."""
    busy = 0.0
    for w in fleet.workers:
        text = scrape(w.url)
        busy += metric(text, "vllm:num_requests_running", model_name="mock-model")
        busy += metric(text, "vllm:num_requests_waiting", model_name="mock-model")
    return busy


def duplicated(ledgers: list[dict[str, int]], results: list[Result]) -> int:
    """Requests of this run that the engines saw more than once, all engines together."""
    seen: Counter[str] = Counter()
    for ledger in ledgers:
        seen.update(ledger)
    return sum(1 for r in results if seen.get(r.rid, 0) > 1)


def run_cell(fleet: Fleet, scenario: str, n: int, rate: float, deadline: float) -> dict[str, Any]:
    _, inject = SCENARIOS[scenario]
    fault_at = n / rate / 3
    out = Injected()
    abort = (fault_at, 2 * fault_at) if scenario == "client-abort" else None
    load = Load(fleet.frontend.url, "mock-model", n, rate, deadline=deadline, abort_window=abort)
    retries_before = retries(fleet)

    async def main() -> list[Result]:
        loop = asyncio.get_running_loop()
        fired: list[asyncio.Future[None]] = []

        def tick(elapsed: float) -> None:
            if not fired and elapsed >= fault_at:
                fired.append(loop.run_in_executor(None, inject, fleet, load.elapsed, out))

        results = await load.run(tick)
        for f in fired:
            await f
        return results

    with HealthWatch(fleet) as watch:
        results = asyncio.run(main())
        full = wait_until(fleet.full, 60, "the fleet full again")  # the fleet comes back, bounded
        time.sleep(0.3)
    t0 = load.started - watch.t0  # the load's clock on the watch's
    in_flight = leaked = -1.0
    try:
        wait_until(lambda: fleet.in_flight() == 0, 20, "in flight back to 0")
    except AssertionError:
        pass
    in_flight = fleet.in_flight()
    try:
        wait_until(lambda: engines_busy(fleet) == 0, 20, "engines idle")
    except AssertionError:
        pass
    leaked = engines_busy(fleet)
    bad = [r.sent_at for r in results if r.outcome not in ("ok", "aborted") and r.sent_at >= out.at]
    back = watch.full_again_after(t0 + out.at)
    recovery = max([0.0, *((b - out.at) for b in bad),
                    *([back - t0 - out.at] if back is not None else [])])
    row: dict[str, Any] = {
        "scenario": scenario, "plane": PLANE_NAMES[fleet.plane], **tally(results),
        "dup": duplicated(out.ledgers + fleet.ledgers(), results),
        # clean errors answered as a status: nothing had reached the client, so retries were spent or not possible
        "error_status": sum(1 for r in results if r.outcome == "error" and r.status != 200),
        "retries": retries(fleet) - retries_before if scenario != "frontend-term" else retries(fleet),
        "recovery_s": round(recovery, 2), "fault_at_s": round(out.at, 2), "full_wait_s": round(full, 2),
        "in_flight_after": in_flight, "engine_busy_after": leaked,
        "lost_sent_after_fault_s": [round(r.sent_at - out.at, 3) for r in results if r.outcome == "lost"],
        "problems": sorted(Counter(f"{r.outcome}: {r.detail[:90]}" for r in results
                                   if r.outcome not in ("ok", "aborted")).items(), key=lambda kv: -kv[1])[:6],
    }
    fleet.clear_faults()
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| scenario | plane | sent | ok | clean errors | refused | aborted | lost | hung | dup | retries "
            "| recovery s | in flight after |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['plane']} | {r['sent']} | {r['ok']} | {r['error']} | {r['refused']} "
                     f"| {r['aborted']} | {r['lost']} | {r['hung']} | {r['dup']} | {r['retries']:.0f} "
                     f"| {r['recovery_s']:.1f} | {r['in_flight_after']:.0f} |")
    return "\n".join(lines)


def run(planes: list[str], scenarios: list[str], n: int, rate: float, deadline: float,
        tmp: Path, python: str = PYTHON, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    tokenizer = default_tokenizer_dir()
    rows: list[dict[str, Any]] = []
    for plane in planes:
        todo = [s for s in scenarios if plane in SCENARIOS[s][0]]
        if not todo:
            continue
        fleet = Fleet(plane, tmp / plane, tokenizer, python=python)
        try:
            fleet.start()
            for scenario in todo:
                started = time.monotonic()
                row = run_cell(fleet, scenario, n, rate, deadline)
                rows.append(row)
                log(f"{scenario:16s} {row['plane']:15s} sent {row['sent']} ok {row['ok']} err {row['error']} "
                    f"refused {row['refused']} aborted {row['aborted']} lost {row['lost']} hung {row['hung']} "
                    f"dup {row['dup']} recovery {row['recovery_s']}s in-flight {row['in_flight_after']:.0f} "
                    f"({time.monotonic() - started:.0f}s) {row['problems'][:2]}")
        finally:
            fleet.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("--planes", default=",".join(PLANES), help=f"comma-separated, of {', '.join(PLANES)}")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of " + ", ".join(SCENARIOS))
    ap.add_argument("--requests", type=int, default=300, help="requests per cell")
    ap.add_argument("--rate", type=float, default=25.0, help="requests per second (open loop)")
    ap.add_argument("--deadline", type=float, default=30.0, help="seconds after which a request counts as hung")
    args = ap.parse_args(argv)
    planes = [p for p in args.planes.split(",") if p]
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = [p for p in planes if p not in PLANES] + [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown: {', '.join(unknown)}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="infera-faults-") as tmp:
        rows = run(planes, scenarios, args.requests, args.rate, args.deadline, Path(tmp))
    print()
    print(table(rows))
    path = write_results("faults", {"machine": machine_info(), "args": vars(args), "rows": rows,
                                    "wall_s": round(time.monotonic() - started, 1)})
    print(f"\nresults: {path}")
    bad = [r for r in rows if r["lost"] or r["hung"] or r["in_flight_after"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
