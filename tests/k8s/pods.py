"""Worker pods as the operator renders them, for discovery tests against the emulator."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

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
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
