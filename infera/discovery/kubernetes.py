"""Kubernetes discovery: workers are the Ready pods of a label selector that carry a record annotation.

Each worker wrapper writes its record into its own pod's ``infera.ai/worker`` annotation (see
:mod:`infera.discovery.kubernetes_registrar`). This view lists the pods of ``label_selector`` in one
namespace and then watches from the list's resourceVersion. A pod counts while it is Ready, not
terminating, and its annotation parses as a record this build understands; anything else is not
routable (an unparsable annotation is logged once per value).

Failure handling, which is the point of this module:

- a watch that ends (server timeout) resumes from the last resourceVersion seen;
- a watch whose resourceVersion is too old (410 Gone) leads to a fresh list, and only the
  differences between the old view and the new list are emitted: the fleet is never dropped;
- while the API server is unreachable the last view stays, and the loop retries with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch
from pydantic import ValidationError

from infera.discovery.base import FleetListener, WorkerTable
from infera.discovery.kubernetes_client import WORKER_ANNOTATION, api_client, own_namespace
from infera.protocols.worker import RECORD_VERSION, WorkerRecord

log = logging.getLogger(__name__)


class InvalidAnnotation(ValueError):
    pass


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Ready condition True and not terminating."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def parse_record(text: str) -> WorkerRecord:
    """The worker record in an annotation value; raises :class:`InvalidAnnotation`."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidAnnotation(f"not JSON: {exc}") from exc
    try:
        record = WorkerRecord.model_validate(raw)
    except ValidationError as exc:
        raise InvalidAnnotation(f"not a worker record: {exc.errors()[:2]}") from exc
    if record.version > RECORD_VERSION:
        raise InvalidAnnotation(f"record version {record.version} is newer than this build's {RECORD_VERSION}")
    return record


class KubernetesFleet:
    """A :class:`~infera.discovery.base.FleetView` over the pods of a label selector."""

    def __init__(
        self,
        label_selector: str,
        namespace: str = "",
        *,
        kubeconfig: str = "",
        annotation: str = WORKER_ANNOTATION,
        watch_timeout: float = 240.0,
        retry_delay: float = 0.5,
        max_retry_delay: float = 15.0,
    ) -> None:
        self.label_selector = label_selector
        self.namespace = own_namespace(namespace)
        self._kubeconfig = kubeconfig
        self._annotation = annotation
        self._watch_timeout = watch_timeout
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._client: ApiClient | None = None
        self._api: CoreV1Api | None = None
        self._pods: dict[str, WorkerRecord] = {}  # pod name -> record, routable pods only
        self._warned: dict[str, str] = {}  # pod name -> the invalid annotation value already logged
        self._table = WorkerTable()
        self._resource_version: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.relists = 0  # lists done (the first, and one after each 410 or outage)

    def workers(self) -> dict[str, WorkerRecord]:
        return self._table.workers()

    def subscribe(self, listener: FleetListener) -> None:
        self._table.subscribe(listener)

    async def start(self) -> None:
        """Connect and list once (so the first requests see the fleet), then watch in the background.

        An unreachable API server at start is logged, not fatal: the loop keeps trying.
        """
        self._client = await api_client(self._kubeconfig)
        self._api = CoreV1Api(self._client)
        try:
            await self._relist()
        except Exception as exc:
            log.warning("kubernetes discovery: first list of pods (%s in %s) failed, retrying: %s",
                        self.label_selector, self.namespace, _brief(exc))
        self._task = asyncio.create_task(self._run(), name="kubernetes-fleet")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _run(self) -> None:
        delay = self._retry_delay
        while True:
            try:
                if self._resource_version is None:
                    await self._relist()
                await self._watch()
                delay = self._retry_delay
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    log.info("kubernetes discovery: watch expired (410 Gone), relisting; keeping %d workers "
                             "meanwhile", len(self._table.workers()))
                    self._resource_version = None
                    continue
                log.warning("kubernetes discovery: API error %s, keeping the last view of %d workers: %s",
                            exc.status, len(self._table.workers()), exc.reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry_delay)
            except Exception as exc:
                log.warning("kubernetes discovery: API server unreachable, keeping the last view of %d workers: %s",
                            len(self._table.workers()), _brief(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry_delay)

    async def _relist(self) -> None:
        assert self._api is not None
        resp: Any = await self._api.list_namespaced_pod(self.namespace, label_selector=self.label_selector,
                                                        _preload_content=False)  # the raw response
        body = json.loads(await resp.read())
        pods: dict[str, WorkerRecord] = {}
        for pod in body.get("items") or []:
            name = pod["metadata"]["name"]
            record = self._routable(name, pod)
            if record is not None:
                pods[name] = record
        self._pods = pods
        self._resource_version = str(body["metadata"]["resourceVersion"])
        self.relists += 1
        self._publish()

    async def _watch(self) -> None:
        assert self._api is not None
        async with Watch() as watch:
            stream = watch.stream(self._api.list_namespaced_pod, self.namespace, label_selector=self.label_selector,
                                  resource_version=self._resource_version, allow_watch_bookmarks=True,
                                  timeout_seconds=max(1, int(self._watch_timeout)))
            async for event in stream:
                obj = event["raw_object"]
                kind = event["type"]
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self._resource_version = str(rv)
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                record = None if kind == "DELETED" else self._routable(name, obj)
                if record is None:
                    self._pods.pop(name, None)
                    if kind == "DELETED":
                        self._warned.pop(name, None)
                else:
                    self._pods[name] = record
                self._publish()

    def _routable(self, name: str, pod: Mapping[str, Any]) -> WorkerRecord | None:
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(self._annotation)
        if text is None:
            return None
        try:
            record = parse_record(text)
        except InvalidAnnotation as exc:
            if self._warned.get(name) != text:
                self._warned[name] = text
                log.warning("pod %s/%s: annotation %s is invalid, pod skipped: %s", self.namespace, name,
                            self._annotation, exc)
            return None
        self._warned.pop(name, None)
        return record if pod_ready(pod) else None

    def _publish(self) -> None:
        """Recompute the worker map from the pods and emit what changed."""
        new: dict[str, WorkerRecord] = {}
        owner: dict[str, str] = {}
        for pod_name in sorted(self._pods):
            record = self._pods[pod_name]
            if record.instance_id in new:
                log.warning("pods %s and %s both claim worker %s; using %s", owner[record.instance_id], pod_name,
                            record.instance_id, owner[record.instance_id])
                continue
            new[record.instance_id] = record
            owner[record.instance_id] = pod_name
        self._table.replace(new, "its pod is gone, not Ready, or lost its record")


def _brief(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]
