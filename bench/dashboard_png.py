"""The Grafana dashboard's panels, drawn from a real run: ``python -m bench.dashboard_png --seconds 60``.

No Grafana renderer installs from the package registries (Grafana's image renderer is a plugin of
a running Grafana that fetches its own browser), so this draws the dashboard itself: N mock
engines and one kv-aware frontend (the harness's launchers) serve the tenants workload
(bench/workloads.py: tenants sharing long system prompts, Poisson arrivals) while every target's
``/metrics`` is scraped every few seconds, as Prometheus would (labels ``job`` and ``instance``; an
engine's instance is its name, so legends match the frontend's worker ids). One engine is
SIGKILLed at 60 % of the run. Then every panel's own PromQL from
``deploy/grafana/infera-dashboard.json`` is evaluated over those scrapes (bench/promql_eval.py)
at every scrape time and drawn where the dashboard's grid puts it, to ``bench/plots/dashboard.png``.
The picker's panels stay empty: no endpoint picker runs here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import workloads
from bench.common import PLOTS, REPO, Proc, default_tokenizer_dir, frontend, frontend_ready, machine_info, mock_engine
from bench.common import stop_all as stop_procs
from bench.promql_eval import Labels, Store, evaluate
from bench.quality_load import run_cell

DASHBOARD = REPO / "deploy" / "grafana" / "infera-dashboard.json"
MODEL = "bench-model"
UNITS = {"reqps": "req/s", "ops": "ops/s", "s": "seconds", "percentunit": "%", "short": ""}


@dataclass
class Run:
    store: Store = field(default_factory=Store)
    times: list[float] = field(default_factory=list)
    scrapes: list[tuple[float, dict[str, str], str | None]] = field(default_factory=list)
    killed_at: float | None = None
    victim: str = ""
    ok: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, t: float, target: dict[str, str], text: str | None) -> None:
        self.store.add(t, target, text)
        self.scrapes.append((t, target, text))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"times": self.times, "killed_at": self.killed_at, "victim": self.victim,
                                    "ok": self.ok, "errors": self.errors, "scrapes": self.scrapes}))

    @classmethod
    def load(cls, path: Path) -> Run:
        data = json.loads(path.read_text())
        run = cls(times=data["times"], killed_at=data["killed_at"], victim=data["victim"], ok=data["ok"],
                  errors=data["errors"])
        for t, target, text in data["scrapes"]:
            run.add(t, target, text)
        return run


async def _scrape(session: Any, url: str) -> str | None:
    try:
        async with session.get(url + "/metrics") as resp:
            return str(await resp.text()) if resp.status == 200 else None
    except Exception:  # a dead or slow target: Prometheus marks its series stale
        return None


async def drive(args: argparse.Namespace, fe: Proc, engines: list[Proc]) -> Run:
    """Play the workload; scrape every target every ``args.scrape_every`` s; kill one engine on time."""
    import aiohttp

    run = Run(victim=engines[-1].name)
    w = workloads.tenants(args.tenants, int(args.rate * args.seconds), args.rate, args.max_tokens)
    targets = [({"job": "infera", "instance": f"frontend {fe.url.rsplit(':', 1)[1]}"}, fe.url)]
    targets += [({"job": "vllm", "instance": e.name}, e.url) for e in engines]
    done = asyncio.Event()
    start = time.monotonic()

    async def scraper() -> None:
        timeout = aiohttp.ClientTimeout(total=args.scrape_every)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                t = time.monotonic() - start
                if run.killed_at is None and t >= args.kill_at * args.seconds:
                    await asyncio.to_thread(engines[-1].kill)
                    run.killed_at = time.monotonic() - start
                texts = await asyncio.gather(*(_scrape(session, url) for _, url in targets))
                for (labels, _), text in zip(targets, texts, strict=True):
                    run.add(t, labels, text)
                run.times.append(t)
                if done.is_set():
                    return
                await asyncio.sleep(max(0.0, start + t + args.scrape_every - time.monotonic()))

    task = asyncio.create_task(scraper())
    cell = await run_cell(fe.url, w, MODEL, (), args.seconds * 3)
    await asyncio.sleep(args.scrape_every * 2)  # let the last requests' counters reach two more scrapes
    done.set()
    await task
    run.ok, run.errors = len(cell["outcomes"]), cell["errors"]
    return run


# ---- the panels --------------------------------------------------------------------------------

def _legend(fmt: str | None, labels: Labels) -> str:
    out = fmt or ("{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "value")
    for k, v in labels:
        out = out.replace("{{" + k + "}}", v)
    return out


def panel_series(panel: dict[str, Any], run: Run, rate_interval: str) -> dict[str, list[float]]:
    """legend -> value at every scrape time (NaN where the query has no result)."""
    series: dict[str, list[float]] = {}
    for target in panel["targets"]:
        expr = target["expr"].replace("$__rate_interval", rate_interval).replace("$job", ".*")
        for i, t in enumerate(run.times):
            result = evaluate(expr, run.store, t)
            vector = {(): result} if isinstance(result, float) else result
            for labels, value in vector.items():
                name = _legend(target.get("legendFormat"), labels)
                series.setdefault(name, [math.nan] * len(run.times))[i] = value
    return series


def _format(value: float, unit: str) -> str:
    if math.isnan(value):
        return "no data"
    if unit == "percentunit":
        return f"{value:.1%}"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    suffix = UNITS.get(unit, unit)
    return f"{value:.3g} {suffix}".strip()


def draw(dashboard: dict[str, Any], run: Run, rate_interval: str, out: Path, subtitle: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_in = 0.42
    width, height = 22.0, rows * unit_in + 1.5
    fig = plt.figure(figsize=(width, height), dpi=72)
    fig.suptitle(f"{dashboard['title']}: every panel's own PromQL over a real run's scrapes (not a Grafana "
                 f"render)\n{subtitle}", fontsize=13, y=1 - 0.12 / height)
    top = 1 - 1.0 / height
    for panel in panels:
        g = panel["gridPos"]
        left, y0 = g["x"] / 24, top - (g["y"] + g["h"]) * unit_in / height
        h, pad = g["h"] * unit_in / height, unit_in / height
        if panel["type"] == "row":
            fig.text(0.005, y0 + h / 2, panel["title"], fontsize=14, weight="bold", va="center")
            continue
        ax = fig.add_axes((left + 0.035, y0 + 0.35 * pad, g["w"] / 24 - 0.045, h - 0.85 * pad))
        ax.set_title(panel["title"], fontsize=11, loc="left")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or "short"
        series = panel_series(panel, run, rate_interval)
        scale = 100.0 if unit == "percentunit" else 1.0
        if panel["type"] == "stat":
            values = next(iter(series.values()), [math.nan] * len(run.times))
            last = next((v for v in reversed(values) if not math.isnan(v)), math.nan)
            ax.plot(run.times, [v * scale for v in values], color="tab:green", alpha=0.35)
            ax.text(0.5, 0.5, _format(last, unit), transform=ax.transAxes, ha="center", va="center",
                    fontsize=22, weight="bold", color="tab:green")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for name, values in sorted(series.items()):
            ax.plot(run.times, [v * scale for v in values], label=name, linewidth=1.4)
        if run.killed_at is not None:
            ax.axvline(run.killed_at, color="tab:red", linestyle="--", linewidth=1)
        if not series:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey",
                    fontsize=12)
        elif len(series) <= 8:
            ax.legend(fontsize=7, loc="upper left", ncols=2 if len(series) > 4 else 1, framealpha=0.6)
        ax.set_ylabel(UNITS.get(unit, unit), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_xlim(run.times[0], run.times[-1])
    fig.text(0.5, 0.15 / height, f"x: seconds into the run; red dashed line: {run.victim} SIGKILLed at "
             f"{run.killed_at or 0:.0f} s. The endpoint picker's panels are empty: no picker ran.", ha="center",
             fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def record(args: argparse.Namespace) -> Run:
    """Start the engines and the frontend, drive and scrape them (see :func:`drive`), stop them."""
    tok = default_tokenizer_dir()
    with tempfile.TemporaryDirectory(prefix="dashboard-") as tmp:
        logs = Path(tmp)
        engines = [mock_engine(f"engine-{k}", tok, MODEL, logs, args.speedup) for k in range(args.engines)]
        procs: list[Proc] = list(engines)
        try:
            for e in engines:
                e.start()
            for e in engines:
                e.wait_ready("/infera/worker", 60)
            fe = frontend("frontend", tok, "kv-aware", engines, logs)
            procs.append(fe.start())
            fe.wait_ready("/health", 60, frontend_ready(len(engines)))
            return asyncio.run(drive(args, fe, engines))
        finally:
            stop_procs(procs[::-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the workload's arrivals")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second (Poisson)")
    ap.add_argument("--engines", type=int, default=3)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--speedup", type=float, default=1.0, help="the mock engines' --speedup-ratio (1: real time)")
    ap.add_argument("--scrape-every", type=float, default=2.0, help="seconds between scrapes")
    ap.add_argument("--rate-interval", default="15s", help="what $__rate_interval stands for")
    ap.add_argument("--kill-at", type=float, default=0.6, help="share of --seconds at which one engine dies")
    ap.add_argument("--out", type=Path, default=PLOTS / "dashboard.png")
    ap.add_argument("--save-scrapes", type=Path, help="also write every scrape (JSON), to redraw without a run")
    ap.add_argument("--from-scrapes", type=Path, help="redraw from scrapes saved by --save-scrapes; no run")
    args = ap.parse_args(argv)
    run = Run.load(args.from_scrapes) if args.from_scrapes else record(args)
    if args.save_scrapes:
        run.save(args.save_scrapes)
    info = machine_info()
    subtitle = (f"{args.engines} mock engines (x{args.speedup:g}) + 1 kv-aware frontend, tenants workload "
                f"{args.rate:g} req/s for {args.seconds:g} s: {run.ok} ok, {len(run.errors)} errors; scraped every "
                f"{args.scrape_every:g} s, $__rate_interval = {args.rate_interval}; {info['nproc']} cores, "
                f"{info['date']}")
    draw(json.loads(DASHBOARD.read_text()), run, args.rate_interval, args.out, subtitle)
    print(f"{run.ok} requests ok, {len(run.errors)} errors, {len(run.times)} scrapes, {run.victim} killed at "
          f"{run.killed_at or 0:.1f} s -> {args.out}")
    for error in run.errors[:5]:
        print("  error:", error[:200], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
