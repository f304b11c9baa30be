"""reconcile() against the in-memory API server: children, owner references, idempotence, status."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.kube.emulator import Emulator
from infera.discovery.kubernetes_client import api_client
from infera.operator.kube import Kube
from infera.operator.reconcile import reconcile
from tests.operator.manifests import validate

NS = "infer"
FLEET = {"apiVersion": "infera.ai/v1alpha1", "kind": "InferaFleet",
         "metadata": {"name": "demo", "namespace": NS},
         "spec": {"model": "m", "engine": "mock", "modelPath": "/tok", "pools": {"mixed": {"replicas": 2}}}}


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


@pytest.fixture
async def kube(emu: Emulator, tmp_path: Path) -> AsyncIterator[Kube]:
    client = await api_client(str(emu.kubeconfig(tmp_path / "kubeconfig")))
    yield Kube(client)
    await client.close()


def children(emu: Emulator) -> set[tuple[str, str]]:
    found = set()
    for api, kind in (("v1", "ServiceAccount"), ("v1", "Service"), ("v1", "ConfigMap"), ("apps/v1", "Deployment"),
                      ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
                      ("inference.networking.k8s.io/v1", "InferencePool"),
                      ("gateway.networking.k8s.io/v1", "HTTPRoute")):
        for obj in emu.list(api, kind, NS):
            found.add((kind, obj["metadata"]["name"]))
    return found


def fleet(emu: Emulator) -> dict[str, Any]:
    got = emu.get("infera.ai/v1alpha1", "InferaFleet", "demo", NS)
    assert got is not None
    return got


def condition(emu: Emulator, kind: str) -> dict[str, Any]:
    return next(c for c in fleet(emu)["status"]["conditions"] if c["type"] == kind)


def set_spec(emu: Emulator, patch: dict[str, Any]) -> None:
    emu.patch("infera.ai/v1alpha1", "InferaFleet", "demo", {"spec": patch}, NS)


def roll_out(emu: Emulator, name: str) -> None:
    """Play the Deployment controller: every replica updated and ready."""
    dep = emu.get("apps/v1", "Deployment", name, NS)
    assert dep is not None
    n = dep["spec"]["replicas"]
    emu.patch("apps/v1", "Deployment", name, {"status": {
        "observedGeneration": dep["metadata"]["generation"], "replicas": n, "updatedReplicas": n,
        "readyReplicas": n, "availableReplicas": n}}, NS, status=True)


async def test_create_is_idempotent_and_owned(emu: Emulator, kube: Kube) -> None:
    created = emu.create(FLEET)
    out = await reconcile(kube, NS, "demo")
    assert children(emu) == {("ServiceAccount", "demo-infera"), ("Role", "demo-infera"),
                             ("RoleBinding", "demo-infera"), ("Deployment", "demo-mixed"),
                             ("Deployment", "demo-frontend"), ("Service", "demo-frontend")}
    assert len(out.created) == 6
    for api, kind in (("apps/v1", "Deployment"), ("v1", "Service")):
        for obj in emu.list(api, kind, NS):
            ref = obj["metadata"]["ownerReferences"][0]
            assert (ref["uid"], ref["controller"]) == (created["metadata"]["uid"], True)
    rv = emu.rv
    again = await reconcile(kube, NS, "demo")
    assert not again.changed and not again.problems
    assert emu.rv == rv, "a second reconcile writes nothing, not even status"


async def test_status_follows_rollout(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    await reconcile(kube, NS, "demo")
    st = fleet(emu)["status"]
    assert st["observedGeneration"] == 1
    assert st["frontend"] == "http://demo-frontend.infer.svc:8000"
    assert st["pools"] == {"mixed": {"replicas": 2, "readyReplicas": 0}}
    assert condition(emu, "Ready")["status"] == "False"
    assert condition(emu, "Progressing")["status"] == "True"
    assert "mixed 0/2 ready" in condition(emu, "Progressing")["message"]
    roll_out(emu, "demo-mixed")
    roll_out(emu, "demo-frontend")
    await reconcile(kube, NS, "demo")
    assert condition(emu, "Ready")["status"] == "True"
    assert condition(emu, "Progressing")["status"] == "False"
    assert condition(emu, "Degraded")["status"] == "False"
    assert fleet(emu)["status"]["readyWorkers"] == 2
    validate({**fleet(emu), "metadata": {"name": "demo"}})  # status fits the CRD schema


async def test_scale_flip_gaie_and_remove_a_pool(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    await reconcile(kube, NS, "demo")
    roll_out(emu, "demo-mixed")
    set_spec(emu, {"pools": {"mixed": {"replicas": 5}}})
    out = await reconcile(kube, NS, "demo")
    assert out.patched == ["Deployment/demo-mixed"]
    dep = emu.get("apps/v1", "Deployment", "demo-mixed", NS)
    assert dep is not None and dep["spec"]["replicas"] == 5
    assert fleet(emu)["status"]["observedGeneration"] == 2
    assert condition(emu, "Progressing")["status"] == "True", "scaled up, not yet rolled out"

    set_spec(emu, {"gaie": {"enabled": True, "gatewayName": "gw"}})
    out = await reconcile(kube, NS, "demo")
    assert {("InferencePool", "demo"), ("HTTPRoute", "demo"), ("Deployment", "demo-epp"),
            ("Service", "demo-epp")} <= children(emu)
    assert ("Deployment", "demo-frontend") not in children(emu)
    assert sorted(out.deleted) == ["Deployment/demo-frontend", "Service/demo-frontend"]
    dep = emu.get("apps/v1", "Deployment", "demo-mixed", NS)
    assert dep is not None
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["worker", "frontend"]
    assert fleet(emu)["status"]["frontend"] == "InferencePool infer/demo via Gateway gw"

    set_spec(emu, {"gaie": {"enabled": False}})
    await reconcile(kube, NS, "demo")
    assert not any(k in ("InferencePool", "HTTPRoute") or n == "demo-epp" for k, n in children(emu))
    dep = emu.get("apps/v1", "Deployment", "demo-mixed", NS)
    assert dep is not None
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["worker"]

    set_spec(emu, {"pools": {"mixed": None, "prefill": {"replicas": 1}, "decode": {"replicas": 1}}})
    await reconcile(kube, NS, "demo")
    deps = {n for k, n in children(emu) if k == "Deployment"}
    assert deps == {"demo-prefill", "demo-decode", "demo-frontend"}


async def test_the_picker_is_part_of_ready_and_stock_or_infera_swap_cleanly(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    set_spec(emu, {"gaie": {"enabled": True}})
    await reconcile(kube, NS, "demo")
    roll_out(emu, "demo-mixed")
    await reconcile(kube, NS, "demo")
    ready = condition(emu, "Ready")
    assert ready["status"] == "False" and "endpoint picker 0/1 ready" in ready["message"]
    roll_out(emu, "demo-epp")
    await reconcile(kube, NS, "demo")
    assert condition(emu, "Ready")["status"] == "True"
    assert ("ConfigMap", "demo-epp-config") not in children(emu)

    set_spec(emu, {"gaie": {"enabled": True, "picker": "stock"}})
    await reconcile(kube, NS, "demo")
    assert {("ConfigMap", "demo-epp-config"), ("Role", "demo-epp"), ("ServiceAccount", "demo-epp")} <= children(emu)
    set_spec(emu, {"gaie": {"enabled": True, "picker": "infera"}})
    await reconcile(kube, NS, "demo")
    assert not {("ConfigMap", "demo-epp-config"), ("Role", "demo-epp")} & children(emu)


async def test_deleting_the_fleet_collects_its_children(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    await reconcile(kube, NS, "demo")
    emu.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "unrelated", "namespace": NS}})
    emu.delete("infera.ai/v1alpha1", "InferaFleet", "demo", NS)
    assert children(emu) == {("Service", "unrelated")}
    out = await reconcile(kube, NS, "demo")  # a late handler finds nothing to do
    assert not out.changed


async def test_adopts_orphans_and_leaves_foreign_objects(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    emu.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "demo-infera", "namespace": NS}})
    emu.create({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "demo-frontend", "namespace": NS, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "x", "controller": True}]},
        "spec": {"ports": [{"port": 1}]}})
    out = await reconcile(kube, NS, "demo")
    assert out.adopted == ["ServiceAccount/demo-infera"]
    sa = emu.get("v1", "ServiceAccount", "demo-infera", NS)
    assert sa is not None and sa["metadata"]["ownerReferences"][0]["kind"] == "InferaFleet"
    assert condition(emu, "Degraded")["status"] == "True"
    assert condition(emu, "Degraded")["reason"] == "OwnedElsewhere"
    svc = emu.get("v1", "Service", "demo-frontend", NS)
    assert svc is not None and svc["spec"]["ports"] == [{"port": 1}], "not ours: untouched"


async def test_invalid_spec_is_degraded_and_keeps_what_runs(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    await reconcile(kube, NS, "demo")
    before = children(emu)
    set_spec(emu, {"modelPath": ""})  # kv-aware routing without a tokenizer: the frontend would refuse to start
    out = await reconcile(kube, NS, "demo")
    assert not out.changed
    assert children(emu) == before
    assert condition(emu, "Degraded")["reason"] == "InvalidSpec"
    assert "router-tokenizer-path" in condition(emu, "Degraded")["message"]
    assert condition(emu, "Ready")["status"] == "False"
    set_spec(emu, {"modelPath": "/tok"})
    await reconcile(kube, NS, "demo")
    assert condition(emu, "Degraded")["status"] == "False"


async def test_drift_is_repaired(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    await reconcile(kube, NS, "demo")
    emu.delete("v1", "Service", "demo-frontend", NS)
    emu.patch("apps/v1", "Deployment", "demo-mixed", {"spec": {"replicas": 9}}, NS, manager="kubectl-scale")
    out = await reconcile(kube, NS, "demo")
    assert out.created == ["Service/demo-frontend"] and out.patched == ["Deployment/demo-mixed"]
    dep = emu.get("apps/v1", "Deployment", "demo-mixed", NS)
    assert dep is not None and dep["spec"]["replicas"] == 2
    # a hand-edited selector (an update by another field manager) is taken back too
    svc = emu.get("v1", "Service", "demo-frontend", NS)
    assert svc is not None
    selector = dict(svc["spec"]["selector"])
    emu.patch("v1", "Service", "demo-frontend", {"spec": {"selector": {k: "elsewhere" for k in selector}}}, NS,
              manager="kubectl-edit")
    out = await reconcile(kube, NS, "demo")
    assert out.patched == ["Service/demo-frontend"]
    svc = emu.get("v1", "Service", "demo-frontend", NS)
    assert svc is not None and svc["spec"]["selector"] == selector


async def test_keys_an_earlier_spec_set_are_removed(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    await reconcile(kube, NS, "demo")
    set_spec(emu, {"gaie": {"enabled": True, "gatewayName": "gw"}})
    await reconcile(kube, NS, "demo")
    dep = emu.get("apps/v1", "Deployment", "demo-mixed", NS)
    assert dep is not None and "infera.ai/gateway-target" in dep["spec"]["template"]["metadata"]["labels"]
    set_spec(emu, {"gaie": {"enabled": False}})
    await reconcile(kube, NS, "demo")
    dep = emu.get("apps/v1", "Deployment", "demo-mixed", NS)
    assert dep is not None and "infera.ai/gateway-target" not in dep["spec"]["template"]["metadata"]["labels"], \
        "merge patch left the GAIE label on the worker pods; an apply removes what it no longer sends"


async def test_other_owner_references_survive(emu: Emulator, kube: Kube) -> None:
    emu.create(FLEET)
    await reconcile(kube, NS, "demo")
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": "u-1"}
    emu.patch("v1", "ServiceAccount", "demo-infera", {"metadata": {"ownerReferences": [
        *(emu.get("v1", "ServiceAccount", "demo-infera", NS) or {})["metadata"]["ownerReferences"], other]}}, NS)
    set_spec(emu, {"pools": {"mixed": {"replicas": 3}}})
    await reconcile(kube, NS, "demo")
    sa = emu.get("v1", "ServiceAccount", "demo-infera", NS)
    assert sa is not None and {r["uid"] for r in sa["metadata"]["ownerReferences"]} >= {"u-1"}
