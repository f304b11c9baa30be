"""bench/dashboard_png.py draws every panel of the dashboard from scrapes (in-process, no run)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.dashboard_png import DASHBOARD, Run, draw, panel_series

FRONTEND = {"job": "infera", "instance": "frontend"}


def scrape(requests: float, in_flight: dict[str, float]) -> str:
    lines = ["# TYPE infera_requests counter",
             f'infera_requests_total{{endpoint="/v1/chat/completions",status="200"}} {requests}',
             "# TYPE infera_worker_in_flight gauge"]
    lines += [f'infera_worker_in_flight{{worker="{w}"}} {v}' for w, v in in_flight.items()]
    return "\n".join(lines) + "\n"


def synthetic_run() -> Run:
    run = Run(victim="w2", killed_at=4.0, ok=3)
    for t in range(0, 10, 2):
        workers = {"w1": 1.0, "w2": 2.0} if t < 4 else {"w1": 3.0}
        run.add(float(t), FRONTEND, scrape(10.0 * t, workers))
        run.times.append(float(t))
    return run


def test_panel_series_follow_the_legend_format_and_end_with_their_target() -> None:
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    run = synthetic_run()
    in_flight = panel_series(panels["In flight per worker"], run, "5s")
    assert in_flight["w1"] == [1.0, 1.0, 3.0, 3.0, 3.0]
    assert in_flight["w2"][:2] == [2.0, 2.0] and all(math.isnan(v) for v in in_flight["w2"][2:])
    by_status = panel_series(panels["Requests by endpoint and status"], run, "5s")
    assert by_status["/v1/chat/completions 200"][1:] == [10.0] * 4  # the counter is 10 t
    assert panel_series(panels["Picks by outcome"], run, "5s") == {}


def test_draw_writes_a_png_and_saved_scrapes_redraw_the_same(tmp_path: Path) -> None:
    run = synthetic_run()
    run.save(tmp_path / "scrapes.json")
    again = Run.load(tmp_path / "scrapes.json")
    assert again.times == run.times and again.store.series.keys() == run.store.series.keys()
    draw(json.loads(DASHBOARD.read_text()), again, "5s", tmp_path / "dashboard.png", "test")
    assert (tmp_path / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
