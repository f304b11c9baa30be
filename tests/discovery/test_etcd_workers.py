"""Real worker processes (the mock engine registering itself) against a real etcd."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import EtcdServer, Process, free_port, http_ok, metric, scrape, spawn
from infera.discovery.etcd import EtcdFleet
from tests.discovery.test_etcd import eventually


def start_registered_mock(tmp: Path, etcd: EtcdServer, *args: str) -> Process:
    port = free_port()
    argv = [sys.executable, "-m", "infera.engine.mock", "--host", "127.0.0.1", "--port", str(port),
            "--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint, "--log-level", "info",
            "--request-transport", "http", "--kv-event-transport", "zmq", *args]
    proc = spawn(argv, f"http://127.0.0.1:{port}", tmp / f"mock-{port}.log")
    proc.wait_until(lambda: http_ok(proc.url + "/health"))
    return proc


@pytest.fixture
def procs() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for p in started:
        p.stop()


def completion(url: str, max_tokens: int) -> dict[str, Any]:
    body = json.dumps({"model": "mock-model", "prompt": "hello there", "max_tokens": max_tokens,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.load(resp))


async def test_sigkilled_worker_leaves_within_its_ttl(etcd: EtcdServer, tmp_path: Path, procs: list[Process]) -> None:
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    try:
        t0 = time.monotonic()
        worker = start_registered_mock(tmp_path, etcd, "--lease-ttl", "3", "--instance-id", "doomed")
        procs.append(worker)
        await eventually(lambda: "doomed" in fleet.workers(), what="registered")
        print(f"\nmock start -> routable: {time.monotonic() - t0:.2f}s")
        worker.kill()
        gone = await eventually(lambda: "doomed" not in fleet.workers(), limit=6.0, what="expired")
        print(f"SIGKILL -> left the view: {gone:.2f}s (lease TTL 3s)")
        assert gone <= 3 + 1.5
    finally:
        await fleet.stop()


async def test_sigterm_deregisters_first_then_drains(etcd: EtcdServer, tmp_path: Path, procs: list[Process]) -> None:
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    try:
        worker = start_registered_mock(tmp_path, etcd, "--instance-id", "leaving", "--drain-seconds", "20")
        procs.append(worker)
        await eventually(lambda: "leaving" in fleet.workers(), what="registered")
        removed_at: list[float] = []
        fleet.subscribe(lambda c: removed_at.append(time.monotonic()) if c.kind == "remove" else None)
        request = asyncio.ensure_future(asyncio.to_thread(completion, worker.url, 400))  # ~2-3 s of decode
        await eventually(lambda: metric(scrape(worker.url), "vllm:num_requests_running") == 1, what="decoding")
        assert not request.done()
        sent = time.monotonic()
        worker.popen.send_signal(signal.SIGTERM)
        body = await request
        finished = time.monotonic()
        assert body["usage"]["completion_tokens"] == 400  # the in-flight request completed
        assert removed_at and removed_at[0] < finished  # the record was gone before it finished
        print(f"\nSIGTERM -> left the view: {removed_at[0] - sent:.3f}s; in-flight request done after "
              f"{finished - sent:.2f}s")
        await asyncio.to_thread(worker.popen.wait, 15)
        assert "leaving" not in fleet.workers()
    finally:
        await fleet.stop()
