"""Short versions of the reliability suite (``bench.faults``, ``bench.soak``): faults under load.

A loaded two-core box makes rates and recovery times noisy, so these assert invariants only:
nothing lost, nothing hung, every request accounted for, in-flight gauges and engines back to 0,
no state kept for departed workers.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fault_fleet import TIMEOUT_S, Fleet, post_json
from bench.faults import run_cell
from bench.soak import soak

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.timeout(300)]  # a fleet start on a loaded box


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path) -> Iterator[Fleet]:
    """Three mock engines on etcd/http/zmq (the bench covers the other planes); the soak runs last on it."""
    f = Fleet("etcd", tmp_path_factory.mktemp("faults"), qwen_tokenizer_dir, python=sys.executable)
    try:
        f.start()
        yield f
    finally:
        f.stop()


def assert_clean(row: dict[str, object]) -> None:
    accounted = sum(int(row[k]) for k in ("ok", "error", "refused", "aborted", "lost", "hung"))  # type: ignore[call-overload]
    assert accounted == row["sent"]
    assert row["lost"] == 0 and row["hung"] == 0, row["problems"]
    assert row["in_flight_after"] == 0, "the frontend leaked in-flight load"
    assert row["engine_busy_after"] == 0, "an engine still runs or queues requests nobody waits for"


@pytest.mark.parametrize("scenario", ["worker-kill", "worker-hang", "client-abort", "frontend-term"])
def test_a_fault_under_load_loses_and_hangs_nothing(fleet: Fleet, scenario: str) -> None:
    row = run_cell(fleet, scenario, n=80, rate=20.0, deadline=30.0)
    assert_clean(row)
    if scenario == "client-abort":
        assert row["aborted"] > 0
    if scenario in ("worker-kill", "worker-hang"):
        assert row["ok"] + row["error"] == row["sent"]  # two workers stay up: nothing is refused


def test_a_stream_whose_worker_hangs_mid_way_ends_with_an_error_event(fleet: Fleet) -> None:
    """The defect the suite found: a worker hung mid-stream held the client's stream forever."""
    body = {"model": "mock-model", "messages": [{"role": "user", "content": "a long answer"}],
            "max_tokens": 4000, "stream": True}
    req = urllib.request.Request(fleet.frontend.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=60) as resp:
        serving = next(w for w in fleet.workers if w.name == resp.headers["x-infera-worker"])
        assert resp.readline().startswith(b"data: ")  # mid-stream now
        post_json(serving.url + "/infera/faults", {"hang": True})
        try:
            tail = resp.read().decode()
        finally:
            post_json(serving.url + "/infera/faults", {"hang": False})
    assert time.monotonic() - started < TIMEOUT_S + 20
    events = [json.loads(line[6:]) for line in tail.splitlines() if line.startswith("data: {")]
    assert "error" in events[-1] and events[-1]["error"]["code"] == 504
    assert "[DONE]" not in tail


def test_a_short_soak_with_churn_keeps_nothing_of_departed_workers(fleet: Fleet, tmp_path: Path) -> None:
    out = soak(minutes=0.5, rate=8.0, churn_minutes=0.15, sample_s=5.0, warmup_minutes=0.1, tmp=tmp_path,
               log=lambda *a, **k: None, fleet=fleet)
    outcomes = out["outcomes"]
    assert outcomes["lost"] == 0 and outcomes["hung"] == 0, out["problems"]
    assert outcomes["ok"] + outcomes["error"] == outcomes["sent"]
    assert out["churned"], "no worker was replaced"
    last = out["samples"][-1]
    assert last["departed_in_metrics"] == 0 and last["departed_in_view"] == 0
