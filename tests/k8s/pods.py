"""Worker pods as the operator renders them, for discovery tests against the emulator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import await_until
from infera.discovery.kubernetes_client import WORKER_ANNOTATION
from infera.protocols.worker import WorkerRecord

WORKER_LABELS = {"app.kubernetes.io/component": "infera-worker", "infera.ai/fleet": "demo"}
SELECTOR = "app.kubernetes.io/component=infera-worker,infera.ai/fleet=demo"


def record(instance_id: str, url: str = "", model: str = "mock-model", **extra: Any) -> WorkerRecord:
    return WorkerRecord(instance_id=instance_id, model=model, http_url=url or f"http://10.0.0.1/{instance_id}",
                        **extra)


def pod(name: str, rec: WorkerRecord | str | None = None, *, namespace: str = "default",
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    annotations = {}
    if rec is not None:
        annotations[WORKER_ANNOTATION] = rec if isinstance(rec, str) else rec.model_dump_json()
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(WORKER_LABELS if labels is None
                                                                              else labels),
                         "annotations": annotations},
            "spec": {"containers": [{"name": "worker", "image": "infera:dev"}]}}


async def eventually(cond: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    await await_until(cond, within, what)
