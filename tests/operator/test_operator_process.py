"""``python -m infera.operator`` (kopf) against the in-memory API server: the handlers are wired."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import Process, spawn
from harness.kube.emulator import Emulator

pytestmark = pytest.mark.slow

NS = "default"
FLEET = {"apiVersion": "infera.ai/v1alpha1", "kind": "InferaFleet",
         "metadata": {"name": "demo", "namespace": NS},
         "spec": {"model": "m", "engine": "mock", "modelPath": "/tok", "pools": {"mixed": {"replicas": 1}}}}


def wait(cond: Callable[[], object], what: str, proc: Process, timeout: float = 30.0) -> None:
    proc.wait_until(cond, timeout, what)


@pytest.fixture
def operator(tmp_path: Path) -> Iterator[tuple[Emulator, Process]]:
    with Emulator() as emu:
        kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
        proc = spawn([sys.executable, "-m", "infera.operator", "--namespace", NS, "--liveness-port", "0",
                      "--resync-seconds", "1"], "operator", tmp_path / "operator.log",
                     env={"KUBECONFIG": str(kubeconfig)})
        try:
            yield emu, proc
        finally:
            proc.stop()


def test_operator_reconciles_updates_and_cleans_up(operator: tuple[Emulator, Process]) -> None:
    emu, proc = operator
    emu.create(FLEET)
    wait(lambda: emu.get("apps/v1", "Deployment", "demo-mixed", NS), "worker Deployment", proc)
    wait(lambda: (emu.get("infera.ai/v1alpha1", "InferaFleet", "demo", NS) or {}).get("status", {}).get("conditions"),
         "status conditions", proc)
    fleet = emu.get("infera.ai/v1alpha1", "InferaFleet", "demo", NS)
    assert fleet is not None and not fleet["metadata"].get("finalizers"), \
        "nothing needs a finalizer: with one, uninstalling the operator and the CRD together hangs"
    # drift: a kubectl scale of a child is undone by the event it causes, not by the next resync
    emu.patch("apps/v1", "Deployment", "demo-mixed", {"spec": {"replicas": 9}}, NS, manager="kubectl-scale")
    wait(lambda: (emu.get("apps/v1", "Deployment", "demo-mixed", NS) or {}).get("spec", {}).get("replicas") == 1,
         "replicas restored", proc)
    # an update handler: scale the pool
    emu.patch("infera.ai/v1alpha1", "InferaFleet", "demo", {"spec": {"pools": {"mixed": {"replicas": 3}}}}, NS)
    wait(lambda: (emu.get("apps/v1", "Deployment", "demo-mixed", NS) or {}).get("spec", {}).get("replicas") == 3,
         "scaled Deployment", proc)
    # the Deployment controller reports a rollout: the event handler (or the timer) updates status
    dep = emu.get("apps/v1", "Deployment", "demo-mixed", NS)
    assert dep is not None
    emu.patch("apps/v1", "Deployment", "demo-mixed", {"status": {
        "observedGeneration": dep["metadata"]["generation"], "replicas": 3, "updatedReplicas": 3,
        "readyReplicas": 3}}, NS, status=True)
    wait(lambda: (emu.get("infera.ai/v1alpha1", "InferaFleet", "demo", NS) or {}).get("status", {})
         .get("readyWorkers") == 3, "readyWorkers in status", proc)
    # deletion: no finalizer holds the fleet; the garbage collector takes its children
    emu.delete("infera.ai/v1alpha1", "InferaFleet", "demo", NS)
    assert emu.get("infera.ai/v1alpha1", "InferaFleet", "demo", NS) is None, "deleted at once"
    # a reconcile in flight when the fleet went may still write a child: the garbage collector takes it
    wait(lambda: emu.list("apps/v1", "Deployment", NS) == [], "children collected", proc)
