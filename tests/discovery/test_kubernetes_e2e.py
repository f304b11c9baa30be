"""End to end: real frontends (``--discovery-backend kubernetes``) route to real mock engines whose
records sit in pod annotations of the in-memory API server."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import Process, free_port, get_json, spawn, start_mock, wait_until
from harness.kube.emulator import Emulator
from infera.protocols.worker import WorkerRecord
from tests.k8s.pods import SELECTOR, pod

pytestmark = pytest.mark.slow


def complete(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    body = json.dumps({"model": "mock-model", "prompt": "hello there", "max_tokens": 4}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, str(resp.headers["x-infera-worker"])
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def frontend(tmp: Path, kubeconfig: Path, *args: str) -> Process:
    port = free_port()
    argv = [sys.executable, "-m", "infera.server", "--host", "127.0.0.1", "--port", str(port),
            "--discovery-backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--k8s-namespace", "default",
            "--k8s-label-selector", SELECTOR, "--request-transport", "http", "--kv-event-transport", "zmq",
            "--router-policy", "round-robin", *args]
    return spawn(argv, f"http://127.0.0.1:{port}", tmp / f"frontend-{port}.log")


def workers(proc: Process) -> int:
    try:
        return int(get_json(proc.url + "/health", 1.0)["workers"])
    except urllib.error.HTTPError:
        return 0


def wait(cond: Any, what: str, timeout: float = 20.0) -> None:
    wait_until(cond, timeout, what)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Emulator, Path, list[WorkerRecord]]]:
    tmp = tmp_path_factory.mktemp("k8s-e2e")
    engines = [start_mock(tmp), start_mock(tmp)]
    try:
        with Emulator() as emu:
            records = []
            for i, engine in enumerate(engines):
                record = WorkerRecord.model_validate(get_json(engine.url + "/infera/worker"))
                records.append(record)
                emu.create(pod(f"worker-{i}", record))
                emu.set_pod_ready(f"worker-{i}", True)
            yield emu, emu.kubeconfig(tmp / "kubeconfig"), records
    finally:
        for engine in engines:
            engine.stop()


def test_auto_mode_routes_to_annotated_ready_pods(cluster: tuple[Emulator, Path, list[WorkerRecord]],
                                                  tmp_path: Path) -> None:
    emu, kubeconfig, records = cluster
    proc = frontend(tmp_path, kubeconfig)
    try:
        proc.wait_until(lambda: workers(proc) == 2, what="serving both pods' workers")
        served = {complete(proc.url)[1] for _ in range(4)}
        assert served == {r.instance_id for r in records}
        # the pod turns unready: its worker leaves the frontend's fleet, and comes back
        emu.set_pod_ready("worker-1", False)
        wait(lambda: workers(proc) == 1, "worker-1 to leave")
        assert {complete(proc.url)[1] for _ in range(3)} == {records[0].instance_id}
        emu.set_pod_ready("worker-1", True)
        wait(lambda: workers(proc) == 2, "worker-1 to return")
    finally:
        proc.stop()


def test_sidecar_direct_mode_serves_its_own_worker_unless_told_otherwise(
        cluster: tuple[Emulator, Path, list[WorkerRecord]], tmp_path: Path) -> None:
    _, kubeconfig, records = cluster
    own, other = records[0].instance_id, records[1].instance_id
    proc = frontend(tmp_path, kubeconfig, "--router-mode", "direct", "--direct-default-worker", own)
    try:
        proc.wait_until(lambda: workers(proc) == 2, what="serving both pods' workers")
        assert {complete(proc.url)[1] for _ in range(4)} == {own}, "no header: the pod's own worker"
        assert complete(proc.url, {"x-worker-instance-id": other}) == (200, other)
        assert complete(proc.url, {"x-worker-instance-id": "nobody"})[0] == 503
    finally:
        proc.stop()
