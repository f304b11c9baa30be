"""RBAC in the emulator: service accounts get what their bindings grant, no more, and cannot escalate;
the operator's ClusterRole from deploy/install.yaml is enough for a full reconcile."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from harness.kube import rbac
from harness.kube.emulator import Emulator
from infera.discovery.kubernetes_client import api_client
from infera.operator.kube import KINDS, Kube
from infera.operator.reconcile import reconcile
from tests.operator.manifests import REPO, load_all

PODS = KINDS["Pod"]
ROLES = KINDS["Role"]


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


async def as_account(emu: Emulator, tmp: Path, ns: str, name: str) -> Kube:
    config = emu.kubeconfig(tmp / f"{ns}-{name}.yaml", ns, rbac.sa_token(ns, name))
    return Kube(await api_client(str(config)))


def role(ns: str, rules: list[dict[str, Any]], name: str = "r") -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": ns}, "rules": rules}


def binding(ns: str, account: str, role_name: str = "r") -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{account}-{role_name}", "namespace": ns},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name}}


async def test_an_account_gets_what_its_bindings_grant(emu: Emulator, tmp_path: Path) -> None:
    kube = await as_account(emu, tmp_path, "a", "reader")
    try:
        with pytest.raises(ApiException) as refused:
            await kube.list(PODS, "a")
        assert refused.value.status == 403 and "cannot list resource" in str(refused.value.body)
        emu.create(role("a", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]))
        emu.create(binding("a", "reader"))
        assert await kube.list(PODS, "a") == []
        with pytest.raises(ApiException) as elsewhere:
            await kube.list(PODS, "b")
        assert elsewhere.value.status == 403, "a RoleBinding grants in its own namespace only"
        with pytest.raises(ApiException) as writing:
            await kube.delete(PODS, "a", "x")
        assert writing.value.status == 403
    finally:
        await kube.client.close()


async def test_no_escalation_through_roles(emu: Emulator, tmp_path: Path) -> None:
    emu.create(role("a", [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                           "verbs": ["get", "create", "patch"]},
                          {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}], name="admin"))
    emu.create(binding("a", "maker", "admin"))
    kube = await as_account(emu, tmp_path, "a", "maker")
    try:
        with pytest.raises(ApiException) as refused:
            await kube.apply(role("a", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}], "more"))
        assert refused.value.status == 403 and "not currently held" in str(refused.value.body)
        await kube.apply(role("a", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}], "same"))
    finally:
        await kube.client.close()


async def test_the_operators_cluster_role_is_enough_to_reconcile(emu: Emulator, tmp_path: Path) -> None:
    for doc in load_all(REPO / "deploy" / "install.yaml"):
        if doc["kind"] in ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            emu.create(doc)
    emu.create({"apiVersion": "infera.ai/v1alpha1", "kind": "InferaFleet", "metadata": {"name": "demo",
                "namespace": "infer"}, "spec": {"model": "m", "engine": "mock", "modelPath": "/tok",
                                                "gaie": {"enabled": True, "gatewayName": "gw"}}})
    kube = await as_account(emu, tmp_path, "infera-system", "infera-operator")
    try:
        out = await reconcile(kube, "infer", "demo")
    finally:
        await kube.client.close()
    assert not out.problems, out.problems
    assert out.created, "it created the fleet's children, Role and RoleBinding included (no escalation)"
