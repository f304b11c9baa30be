"""Thin kopf handlers: each one only finds the fleet and calls :func:`infera.operator.reconcile.reconcile`.

Registered on an explicit registry (no module-level decorators, so importing this module has no
side effects): create/update/resume of an InferaFleet, a timer that keeps status true to what runs,
and Deployment events of a fleet's children (a rollout finishing changes the fleet's status).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from infera.config.operator import OperatorSettings
from infera.discovery.kubernetes_client import api_client
from infera.operator.builders import FLEET_LABEL
from infera.operator.kube import Kube
from infera.operator.reconcile import reconcile
from infera.operator.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


async def reconcile_one(memo: Any, namespace: str, name: str) -> None:
    """Reconcile one fleet, one pass at a time (the timer, spec changes and child events overlap)."""
    lock = memo.locks.setdefault((namespace, name), asyncio.Lock())
    async with lock:
        await reconcile(memo.kube, namespace, name)


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = "infera.ai/operator"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="infera.ai")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="infera.ai")
        settings.posting.level = logging.WARNING
        memo.client = await api_client()
        memo.kube = Kube(memo.client)
        memo.locks = {}

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "client", None) is not None:
            await memo.client.close()

    async def fleet_changed(memo: Any, namespace: str | None, name: str, **_: Any) -> None:
        await reconcile_one(memo, namespace or "", name)

    for decorator in (kopf.on.create, kopf.on.update, kopf.on.resume):
        decorator(GROUP, VERSION, PLURAL, registry=registry)(fleet_changed)
    kopf.timer(GROUP, VERSION, PLURAL, interval=settings.resync_seconds, idle=0, registry=registry)(fleet_changed)

    @kopf.on.event("apps", "v1", "deployments", labels={FLEET_LABEL: kopf.PRESENT}, registry=registry)
    async def child_changed(memo: Any, namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
        await reconcile_one(memo, namespace or "", labels[FLEET_LABEL])

    return registry
