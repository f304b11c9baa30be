"""Worker side of Kubernetes discovery: write this worker's record into its own pod's annotation.

The pod is named by the downward API (``POD_NAME``, falling back to ``HOSTNAME``, which is the pod
name unless the spec overrides it) and ``POD_NAMESPACE`` (else the service-account namespace). The
pod's service account needs ``get`` and ``patch`` on pods. Routers only count the worker while the
pod is Ready, so the annotation may be written before the engine's readiness probe passes.

A record removed or changed behind the worker's back (``kubectl annotate --overwrite``, a lost
write) is re-published by a periodic check; ``deregister`` removes the annotation so routers stop
first, before the pod goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from infera.discovery.kubernetes_client import WORKER_ANNOTATION, api_client, own_namespace
from infera.protocols.worker import WorkerRecord

log = logging.getLogger(__name__)


class PodAnnotationRegistrar:
    """A :class:`~infera.discovery.base.Registrar` that publishes to ``metadata.annotations`` of its pod."""

    def __init__(
        self,
        pod_name: str = "",
        namespace: str = "",
        *,
        kubeconfig: str = "",
        annotation: str = WORKER_ANNOTATION,
        recheck_interval: float = 30.0,
        retry_delay: float = 0.5,
        max_retry_delay: float = 15.0,
    ) -> None:
        self.pod_name = pod_name or os.environ.get("POD_NAME") or os.environ.get("HOSTNAME", "")
        if not self.pod_name:
            raise ValueError("kubernetes registrar: no pod name (set POD_NAME from the downward API)")
        self.namespace = own_namespace(namespace or os.environ.get("POD_NAMESPACE", ""))
        self._kubeconfig = kubeconfig
        self._annotation = annotation
        self._recheck = recheck_interval
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._client: ApiClient | None = None
        self._api: CoreV1Api | None = None
        self._value: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def register(self, record: WorkerRecord) -> None:
        """Publish ``record``, retrying until the API server takes it; then keep it published."""
        if self._api is None:
            self._client = await api_client(self._kubeconfig)
            self._api = CoreV1Api(self._client)
        self._value = record.model_dump_json(exclude_none=True)
        await self._publish_until_done()
        log.info("worker %s published on pod %s/%s", record.instance_id, self.namespace, self.pod_name)
        if self._task is None:
            self._task = asyncio.create_task(self._keep(), name="kubernetes-registrar")

    async def update(self, record: WorkerRecord) -> None:
        await self.register(record)

    async def deregister(self) -> None:
        """Stop re-publishing and remove the annotation (best effort: a deleted pod takes it along)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._value = None
        if self._api is not None:
            try:
                await self._patch(None)
            except Exception as exc:
                log.warning("could not remove the worker annotation from pod %s/%s: %s", self.namespace,
                            self.pod_name, exc)
        if self._client is not None:
            await self._client.close()
        self._client = self._api = None

    async def _patch(self, value: str | None) -> None:
        assert self._api is not None
        body = {"metadata": {"annotations": {self._annotation: value}}}
        await self._api.patch_namespaced_pod(self.pod_name, self.namespace, body)

    async def _publish_until_done(self) -> None:
        delay = self._retry_delay
        while True:
            try:
                await self._patch(self._value)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("publishing the worker record on pod %s/%s failed, retrying in %.1fs: %s",
                            self.namespace, self.pod_name, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry_delay)

    async def _keep(self) -> None:
        assert self._api is not None
        while True:
            await asyncio.sleep(self._recheck)
            try:
                pod = await self._api.read_namespaced_pod(self.pod_name, self.namespace)
                current = (pod.metadata.annotations or {}).get(self._annotation)
                if current != self._value:
                    log.warning("worker annotation on pod %s/%s changed behind our back; re-publishing",
                                self.namespace, self.pod_name)
                    await self._publish_until_done()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("checking the worker annotation on pod %s/%s failed: %s", self.namespace,
                            self.pod_name, exc)
