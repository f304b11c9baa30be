"""End to end on the local cluster: real kubectl installs the operator from deploy/install.yaml and
applies the mock sample; the operator (a real process in a pod) builds the fleet; pods run as local
processes; the frontend's Service routes the openai SDK's requests with prefix-cache hits; scaling
the fleet adds a worker that takes traffic; deleting it takes everything away."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from harness.kube.cluster import LocalCluster
from tests.k8s.local import MODEL, REPO, fleet_ready, kubectl, wait

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path, qwen_tokenizer_dir: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


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
