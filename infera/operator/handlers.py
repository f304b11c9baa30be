"""Thin kopf handlers: each one only finds the fleet and calls :func:`infera.operator.reconcile.reconcile`.

Registered on an explicit registry (no module-level decorators, so importing this module has no
side effects): create/update/resume of an InferaFleet, and events of a fleet's Deployments and
Services (a rollout finishing changes the fleet's status; a ``kubectl scale`` or a hand-edited
selector is undone at once). A periodic resync of every fleet keeps status true to what runs; it is
a plain task, not a kopf timer, because kopf puts a finalizer on every resource a timer watches and
nothing here needs one (owner references already delete the children): with a finalizer, removing
the operator and the CRD together left fleets and the CRD stuck Terminating.
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
from infera.operator.reconcile import FLEET, reconcile
from infera.operator.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


async def resync(memo: Any, namespace: str, every: float) -> None:
    """Reconcile every fleet (of ``namespace``, or all) every ``every`` seconds, until cancelled."""
    while True:
        await asyncio.sleep(every)
        try:
            fleets = await memo.kube.list(FLEET, namespace)
        except Exception as exc:  # the API is down: try again next round
            log.warning("resync: cannot list InferaFleets: %s", exc)
            continue
        for fleet in fleets:
            meta = fleet["metadata"]
            try:
                await reconcile_one(memo, meta["namespace"], meta["name"])
            except Exception:
                log.exception("resync of %s/%s failed", meta["namespace"], meta["name"])


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

    operator_settings = settings

    @kopf.on.startup(registry=registry)
    async def startup(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="infera.ai")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="infera.ai")
        settings.posting.level = logging.WARNING
        memo.client = await api_client()
        memo.kube = Kube(memo.client)
        memo.locks = {}
        memo.resync = asyncio.create_task(resync(memo, operator_settings.namespace,
                                                 operator_settings.resync_seconds))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "resync", None) is not None:
            memo.resync.cancel()
        if getattr(memo, "client", None) is not None:
            await memo.client.close()

    async def fleet_changed(memo: Any, namespace: str | None, name: str, **_: Any) -> None:
        await reconcile_one(memo, namespace or "", name)

    for decorator in (kopf.on.create, kopf.on.update, kopf.on.resume):
        decorator(GROUP, VERSION, PLURAL, registry=registry)(fleet_changed)

    async def child_changed(memo: Any, namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
        await reconcile_one(memo, namespace or "", labels[FLEET_LABEL])

    for group, version, plural in (("apps", "v1", "deployments"), ("", "v1", "services")):
        kopf.on.event(group, version, plural, labels={FLEET_LABEL: kopf.PRESENT}, registry=registry)(child_changed)

    return registry
