"""Real Helm against the API emulator: the chart rendered by Helm's own engine is valid Kubernetes, and
``helm install`` then ``helm uninstall`` work end to end on the local cluster.

helm-sdkpy has no ``template`` action: the rendered manifest is the release's ``manifest`` (exactly what
``helm template`` prints for the same values and cluster version), from an install into a bare
emulator that stores objects and runs nothing. Helm's Go client writes its release record (a Secret)
in protobuf and waits through streaming-list watches: the emulator reads the one and serves the other.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.kube.cluster import LocalCluster
from harness.kube.emulator import Emulator
from tests.k8s.local import condition, wait
from tests.operator.helm import CHART, INSTALL, UNINSTALL, helm
from tests.operator.manifests import validate

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = "infera-system"


def install(kubeconfig: Path, values: dict[str, Any], *, wait_ready: bool) -> dict[str, Any]:
    result: dict[str, Any] = helm(INSTALL, kubeconfig, NAMESPACE, "infera", CHART, json.dumps(values),
                                  "1" if wait_ready else "0")
    return result


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator() as emu:
        yield emu


@pytest.mark.parametrize("frontend", [False, True])
def test_helm_renders_the_chart_into_valid_manifests(emulator: Emulator, tmp_path: Path, frontend: bool) -> None:
    release = install(emulator.kubeconfig(tmp_path / "kubeconfig"), {"frontend": {"enabled": frontend}},
                      wait_ready=False)
    docs = [d for d in yaml.safe_load_all(release["manifest"]) if d]
    kinds = sorted(d["kind"] for d in docs)
    want = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "ServiceAccount"]
    if frontend:
        want = sorted([*want, "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"])
    assert kinds == want
    for doc in docs:
        validate({**doc, "metadata": {**doc["metadata"], "namespace": doc["metadata"].get("namespace", NAMESPACE)}})
    assert emulator.get("apps/v1", "Deployment", "infera-operator", NAMESPACE) is not None
    assert emulator.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "inferafleets.infera.ai")


@pytest.mark.timeout(300)
def test_helm_install_waits_for_the_operator_and_uninstall_removes_the_release(tmp_path: Path,
                                                                               qwen_tokenizer_dir: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        release = install(cluster.kubeconfig_path, {}, wait_ready=True)
        assert release["info"]["status"] == "deployed"
        crd = cluster.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "inferafleets.infera.ai")
        assert condition(crd, "Established")
        operator = cluster.get("apps/v1", "Deployment", "infera-operator", NAMESPACE)
        assert operator is not None and operator["status"]["readyReplicas"] == 1, "helm waited for the operator"
        pods = [p for p in cluster.list("v1", "Pod", NAMESPACE) if condition(p, "Ready")]
        assert len(pods) == 1 and pods[0]["metadata"]["name"].startswith("infera-operator-")
        assert cluster.list("v1", "Secret", NAMESPACE, labels="owner=helm,name=infera"), "the release record"

        helm(UNINSTALL, cluster.kubeconfig_path, NAMESPACE, "infera", "1")
        assert cluster.get("apps/v1", "Deployment", "infera-operator", NAMESPACE) is None
        assert cluster.get("rbac.authorization.k8s.io/v1", "ClusterRole", "infera-operator") is None
        assert not cluster.list("v1", "Secret", NAMESPACE, labels="owner=helm,name=infera")
        wait(lambda: not cluster.list("v1", "Pod", NAMESPACE), "the operator's pod to go", cluster, 60)
        # Helm keeps what crds/ installed, by design (deleting a CRD deletes every InferaFleet)
        assert cluster.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "inferafleets.infera.ai")
