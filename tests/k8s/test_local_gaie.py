"""End to end on the local cluster, the GAIE path: real kubectl installs the operator and applies
deploy/samples/gaie-mock-fleet.yaml (a Gateway and a fleet with gaie.enabled); the operator renders the
InferencePool, infera's picker and the HTTPRoute; the picker pod turns Ready through its real gRPC
health probe; the cluster's Gateway controller runs a real Envoy for the Gateway; the openai SDK's
requests go through that Envoy, are placed by the picker (it names the worker) and a conversation
stays on the worker holding its prefix (cached tokens). Deleting the fleet stops the Gateway's Envoy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from harness.http import metric, scrape
from harness.kube.cluster import LocalCluster
from tests.k8s.local import MODEL, REPO, condition, fleet_ready, kubectl, wait

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path, qwen_tokenizer_dir: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path) as c:
        yield c


def gateway_address(cluster: LocalCluster) -> str | None:
    gw = cluster.get("gateway.networking.k8s.io/v1", "Gateway", "inference-gateway")
    if not condition(gw, "Programmed"):
        return None
    return str(gw["status"]["addresses"][0]["value"])  # type: ignore[index]


def picks(cluster: LocalCluster) -> float:
    picker = next(p for p in cluster.list("v1", "Pod", "default") if p["metadata"]["name"].startswith("demo-epp"))
    return metric(scrape(f"http://{picker['status']['podIP']}:9090/metrics"), "infera_picker_picks_total")


@pytest.mark.timeout(480)
def test_requests_through_the_gateway_are_placed_by_the_picker(cluster: LocalCluster) -> None:
    kubectl(cluster, "apply", "--server-side", "-f", str(REPO / "deploy" / "install.yaml"))
    kubectl(cluster, "apply", "--server-side", "-f",
            str(REPO / "deploy" / "samples" / "gaie-mock-fleet.yaml"))
    wait(lambda: fleet_ready(cluster), "the InferaFleet to be Ready (workers and picker)", cluster, 300)
    address = wait(lambda: gateway_address(cluster), "the Gateway to be Programmed", cluster, 60)
    route = cluster.get("gateway.networking.k8s.io/v1", "HTTPRoute", "demo") or {}
    assert all(condition({"status": p}, "ResolvedRefs") for p in route["status"]["parents"]), route["status"]
    picker_pod = next(p for p in cluster.list("v1", "Pod", "default") if p["metadata"]["name"].startswith("demo-epp"))
    assert picker_pod["spec"]["containers"][0]["readinessProbe"]["grpc"], "the picker is probed over gRPC"

    workers = {p["metadata"]["name"] for p in cluster.list("v1", "Pod", "default")
               if p["metadata"]["name"].startswith("demo-mixed")}
    before = picks(cluster)
    client = OpenAI(base_url=f"http://{address}:80/v1", api_key="unused", max_retries=0, timeout=60)
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
    assert set(served) <= workers, f"a worker pod serves: {served} (workers {workers})"
    assert len(set(served)) == 1, f"the conversation moved between workers: {served}"
    assert cached[0] == 0 and min(cached[1:]) > 200, f"later turns reuse the prefix: cached tokens {cached}"
    assert picks(cluster) - before >= 3, "every request was placed by infera's picker"

    kubectl(cluster, "delete", "inferafleet", "demo")  # the route and pool go with it: the Gateway's Envoy stops
    wait(lambda: not cluster.gateways.envoys and gateway_address(cluster) is None, "the gateway to stand down",
         cluster, 60)
    wait(lambda: not cluster.list("v1", "Pod", "default"), "the fleet's pods to go", cluster, 60)
