"""End to end over etcd: workers registered by the vLLM wrapper (around the mock engine), two
frontends with ``--discovery-backend etcd``, a request routed and served."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import REPO, EtcdServer, Process, free_port, get_json, spawn

FAKE = f"{sys.executable} {REPO / 'tests' / 'engine' / 'fake_engine.py'} vllm"


@pytest.fixture
def procs() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for p in reversed(started):
        p.stop()


def worker_ids(frontend: Process) -> set[str]:
    return {w["instance_id"] for w in get_json(frontend.url + "/v1/workers")["data"]}


def chat(frontend: Process) -> tuple[str, dict[str, Any]]:
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 8}).encode()
    req = urllib.request.Request(frontend.url + "/v1/chat/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.headers["x-infera-worker"], dict(json.load(resp))


@pytest.mark.slow
def test_frontends_route_to_workers_registered_in_etcd(etcd: EtcdServer, tmp_path: Path,
                                                       procs: list[Process]) -> None:
    frontends = []
    for _ in range(2):
        port = free_port()
        argv = [sys.executable, "-m", "infera.server", "--host", "127.0.0.1", "--port", str(port),
                "--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint, "--request-transport", "http",
                "--kv-event-transport", "zmq", "--router-policy", "round-robin"]
        frontends.append(spawn(argv, f"http://127.0.0.1:{port}", tmp_path / f"frontend-{port}.log"))
        procs.append(frontends[-1])
    for f in frontends:
        f.wait_until(lambda f=f: worker_ids(f) == set(), what="serving (no workers yet)")
    workers = []
    for name in ("w1", "w2"):
        port = free_port()
        argv = [sys.executable, "-m", "infera.engine.vllm", "--model-path", "fake-model", "--port", str(port),
                "--engine-command", FAKE, "--instance-id", name,
                "--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint, "--drain-seconds", "3",
                "--request-transport", "http", "--kv-event-transport", "zmq"]
        workers.append(spawn(argv, f"http://127.0.0.1:{port}", tmp_path / f"{name}.log"))
        procs.append(workers[-1])
    for f in frontends:
        f.wait_until(lambda f=f: worker_ids(f) == {"w1", "w2"}, timeout=60, what="seeing both workers")
    served = set()
    for f in frontends:
        for _ in range(2):
            worker, body = chat(f)
            assert body["choices"][0]["message"]["content"]
            served.add(worker)
    assert served == {"w1", "w2"}  # round-robin over the etcd fleet, from either replica
    workers[0].popen.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    for f in frontends:
        f.wait_until(lambda f=f: worker_ids(f) == {"w2"}, timeout=5, what="dropping w1")
    print(f"\nSIGTERM -> both frontends dropped w1 in {time.monotonic() - t0:.2f}s")
    assert chat(frontends[1])[0] == "w2"
    assert workers[0].popen.wait(20) == 143
