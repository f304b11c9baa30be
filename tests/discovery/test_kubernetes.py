"""Pod-annotation discovery against the in-memory API server, through kubernetes-asyncio for real."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from harness.kube.emulator import Emulator
from infera.discovery.base import FleetChange
from infera.discovery.kubernetes import KubernetesFleet, parse_record, pod_ready
from infera.discovery.kubernetes_client import WORKER_ANNOTATION
from infera.discovery.kubernetes_registrar import PodAnnotationRegistrar
from tests.k8s.pods import SELECTOR, eventually, pod, record


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


@pytest.fixture
def kubeconfig(emu: Emulator, tmp_path: Path) -> Path:
    return emu.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def fleet(kubeconfig: Path) -> AsyncIterator[tuple[KubernetesFleet, list[FleetChange]]]:
    view = KubernetesFleet(SELECTOR, "default", kubeconfig=str(kubeconfig), watch_timeout=30, retry_delay=0.05,
                           max_retry_delay=0.2)
    changes: list[FleetChange] = []
    view.subscribe(changes.append)
    await view.start()
    yield view, changes
    await view.stop()


def watch_caught_up(view: KubernetesFleet, emu: Emulator) -> bool:
    """The view's watch has seen the API server's latest write (its resourceVersion)."""
    return view._resource_version == str(emu.rv)


def kinds(changes: list[FleetChange]) -> list[tuple[str, str]]:
    return [(c.kind, c.worker.instance_id) for c in changes]


async def test_a_worker_joins_when_its_pod_turns_ready_and_leaves_when_it_goes(
        emu: Emulator, fleet: tuple[KubernetesFleet, list[FleetChange]]) -> None:
    view, changes = fleet
    emu.create(pod("w0", record("w0")))
    await eventually(lambda: watch_caught_up(view, emu), what="the watch to see the pod")
    assert view.workers() == {}, "a pod that is not Ready is not routable"
    emu.set_pod_ready("w0", True)
    await eventually(lambda: "w0" in view.workers(), what="w0 to join")
    emu.set_pod_ready("w0", False)
    await eventually(lambda: view.workers() == {}, what="w0 to leave on unready")
    emu.set_pod_ready("w0", True)
    await eventually(lambda: "w0" in view.workers())
    emu.delete("v1", "Pod", "w0")
    await eventually(lambda: view.workers() == {}, what="w0 to leave on delete")
    assert kinds(changes) == [("add", "w0"), ("remove", "w0"), ("add", "w0"), ("remove", "w0")]


async def test_pods_listed_before_start_are_in_the_first_view(emu: Emulator, kubeconfig: Path) -> None:
    emu.create(pod("w0", record("w0")))
    emu.set_pod_ready("w0", True)
    view = KubernetesFleet(SELECTOR, "default", kubeconfig=str(kubeconfig))
    await view.start()
    try:
        assert set(view.workers()) == {"w0"}, "start() lists before returning"
    finally:
        await view.stop()


async def test_a_record_update_is_an_update(emu: Emulator, fleet: tuple[KubernetesFleet, list[FleetChange]]) -> None:
    view, changes = fleet
    emu.create(pod("w0", record("w0")))
    emu.set_pod_ready("w0", True)
    await eventually(lambda: "w0" in view.workers())
    changed = record("w0", kv_block_size=32)
    emu.patch("v1", "Pod", "w0", {"metadata": {"annotations": {WORKER_ANNOTATION: changed.model_dump_json()}}})
    await eventually(lambda: view.workers()["w0"].kv_block_size == 32)
    assert kinds(changes) == [("add", "w0"), ("update", "w0")]


async def test_invalid_annotation_is_skipped_with_one_log_line(
        emu: Emulator, fleet: tuple[KubernetesFleet, list[FleetChange]], caplog: pytest.LogCaptureFixture) -> None:
    view, _ = fleet
    caplog.set_level(logging.WARNING, logger="infera.discovery.kubernetes")
    emu.create(pod("bad", "{not json"))
    emu.create(pod("incomplete", '{"instance_id": "x"}'))
    emu.create(pod("good", record("good")))
    for name in ("bad", "incomplete", "good"):
        emu.set_pod_ready(name, True)
    await eventually(lambda: "good" in view.workers())
    await eventually(lambda: watch_caught_up(view, emu), what="the watch to see every pod")
    assert set(view.workers()) == {"good"}
    lines = [r.getMessage() for r in caplog.records if "is invalid" in r.getMessage()]
    assert any("default/bad" in line and "not JSON" in line for line in lines)
    assert any("default/incomplete" in line and "not a worker record" in line for line in lines)
    assert len(lines) == 2, "one line per invalid value, not one per event"
    # fixing the annotation makes the pod routable
    emu.patch("v1", "Pod", "bad", {"metadata": {"annotations": {WORKER_ANNOTATION: record("fixed").model_dump_json()}}})
    await eventually(lambda: "fixed" in view.workers())


async def test_label_selector_and_namespace_are_honoured(
        emu: Emulator, fleet: tuple[KubernetesFleet, list[FleetChange]]) -> None:
    view, _ = fleet
    emu.create(pod("other-fleet", record("o1"), labels={"app.kubernetes.io/component": "infera-worker",
                                                        "infera.ai/fleet": "other"}))
    emu.create(pod("elsewhere", record("o2"), namespace="prod"))
    emu.create(pod("mine", record("m1")))
    for name, ns in (("other-fleet", "default"), ("elsewhere", "prod"), ("mine", "default")):
        emu.set_pod_ready(name, True, namespace=ns)
    await eventually(lambda: "m1" in view.workers())
    # a pod relabelled out of the selector leaves; relabelled in, it joins
    emu.patch("v1", "Pod", "mine", {"metadata": {"labels": {"infera.ai/fleet": "other"}}})
    await eventually(lambda: view.workers() == {})
    emu.patch("v1", "Pod", "other-fleet", {"metadata": {"labels": {"infera.ai/fleet": "demo"}}})
    await eventually(lambda: set(view.workers()) == {"o1"})


async def test_watch_expiry_410_relists_without_losing_the_fleet(
        emu: Emulator, fleet: tuple[KubernetesFleet, list[FleetChange]]) -> None:
    view, changes = fleet
    for name in ("w0", "w1"):
        emu.create(pod(name, record(name)))
        emu.set_pod_ready(name, True)
    await eventually(lambda: len(view.workers()) == 2)
    relists = view.relists
    emu.end_watches()
    emu.delete("v1", "Pod", "w1")  # happens while no watch is open
    emu.create(pod("w2", record("w2")))
    emu.set_pod_ready("w2", True)
    emu.expire_history()  # the watch resumes from a compacted resourceVersion: 410 Gone
    await eventually(lambda: set(view.workers()) == {"w0", "w2"}, what="relist after 410")
    assert view.relists > relists
    assert ("remove", "w0") not in kinds(changes), "a relist emits only differences"
    assert kinds(changes)[2:] == [("remove", "w1"), ("add", "w2")]


async def test_api_outage_keeps_the_last_view_and_recovers(
        emu: Emulator, fleet: tuple[KubernetesFleet, list[FleetChange]]) -> None:
    view, changes = fleet
    emu.create(pod("w0", record("w0")))
    emu.set_pod_ready("w0", True)
    await eventually(lambda: "w0" in view.workers())
    emu.outage()
    # outage() returns once the API server refuses connections and every open watch is cut
    assert set(view.workers()) == {"w0"}
    emu.create(pod("w1", record("w1")))  # written while the API is unreachable
    emu.set_pod_ready("w1", True)
    emu.recover()
    await eventually(lambda: set(view.workers()) == {"w0", "w1"}, what="catch-up after the outage")
    assert kinds(changes) == [("add", "w0"), ("add", "w1")]


async def test_duplicate_instance_ids_keep_one_worker(
        emu: Emulator, fleet: tuple[KubernetesFleet, list[FleetChange]]) -> None:
    view, _ = fleet
    emu.create(pod("a", record("same", url="http://a")))
    emu.create(pod("b", record("same", url="http://b")))
    emu.set_pod_ready("a", True)
    emu.set_pod_ready("b", True)
    await eventually(lambda: "same" in view.workers())
    await eventually(lambda: watch_caught_up(view, emu), what="the watch to see both pods")
    assert view.workers()["same"].http_url == "http://a"


def test_pure_helpers() -> None:
    p = pod("x", record("x"))
    assert not pod_ready(p)
    p["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    assert pod_ready(p)
    p["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert not pod_ready(p), "a terminating pod stops taking requests at once"
    with pytest.raises(ValueError, match="newer"):
        parse_record(record("x", version=99).model_dump_json())


async def test_registrar_annotates_its_own_pod_and_removes_it(
        emu: Emulator, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    emu.create(pod("worker-abc", None, namespace="infer"))
    monkeypatch.setenv("POD_NAME", "worker-abc")
    monkeypatch.setenv("POD_NAMESPACE", "infer")
    reg = PodAnnotationRegistrar(kubeconfig=str(kubeconfig), recheck_interval=0.1)
    rec = record("w-abc")
    await reg.register(rec)
    try:
        got = emu.get("v1", "Pod", "worker-abc", "infer")
        assert got is not None
        assert parse_record(got["metadata"]["annotations"][WORKER_ANNOTATION]) == rec
        # removed behind its back: re-published
        emu.patch("v1", "Pod", "worker-abc", {"metadata": {"annotations": {WORKER_ANNOTATION: None}}}, "infer")

        def republished() -> bool:
            p = emu.get("v1", "Pod", "worker-abc", "infer")
            return bool(p and WORKER_ANNOTATION in (p["metadata"].get("annotations") or {}))

        await eventually(republished, 5, "the annotation re-published")
        await reg.update(record("w-abc", kv_block_size=64))
        got = emu.get("v1", "Pod", "worker-abc", "infer")
        assert got is not None
        assert parse_record(got["metadata"]["annotations"][WORKER_ANNOTATION]).kv_block_size == 64
    finally:
        await reg.deregister()
    got = emu.get("v1", "Pod", "worker-abc", "infer")
    assert got is not None
    assert WORKER_ANNOTATION not in (got["metadata"].get("annotations") or {})
    assert got["metadata"]["labels"], "a merge patch leaves the rest of the pod alone"


async def test_registrar_and_view_together(emu: Emulator, kubeconfig: Path,
                                           fleet: tuple[KubernetesFleet, list[FleetChange]]) -> None:
    view, _ = fleet
    emu.create(pod("w9", None))
    emu.set_pod_ready("w9", True)
    reg = PodAnnotationRegistrar("w9", "default", kubeconfig=str(kubeconfig))
    await reg.register(record("w9"))
    await eventually(lambda: "w9" in view.workers())
    await reg.deregister()
    await eventually(lambda: view.workers() == {}, what="deregister to drop the worker")
