"""Worker side of etcd discovery: keep this worker's record at ``/infera/workers/<id>``.

The record lives under a lease of ``ttl`` seconds that a heartbeat refreshes every
``ttl / 3`` seconds. Whatever goes wrong, the heartbeat puts things back by itself:

- etcd unreachable: retry every ``retry`` seconds; once it answers again, the record is
  written again (an etcd restarted on the same data keeps the lease; a fresh one has
  neither lease nor key);
- lease gone (expired while the worker was paused or cut off, or revoked): grant a new
  one and write the record under it;
- key gone while the lease lives (someone deleted it): write it again.

``deregister`` stops the heartbeat, deletes the key (routers drop the worker at once) and
revokes the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from infera.discovery.etcd_client import WORKERS_PREFIX, EtcdClient, EtcdUnavailable
from infera.protocols.worker import WorkerRecord

log = logging.getLogger(__name__)


class EtcdRegistrar:
    def __init__(self, endpoint: str, *, ttl: int = 10, prefix: str = WORKERS_PREFIX, timeout: float = 2.0,
                 retry: float = 0.5) -> None:
        if ttl < 2:
            raise ValueError("lease TTL must be at least 2 seconds")
        self._endpoint = endpoint
        self._timeout = min(timeout, ttl / 3)
        self._client = EtcdClient(endpoint, timeout=self._timeout)
        self._ttl = ttl
        self._prefix = prefix
        self._retry = retry
        self._record: WorkerRecord | None = None
        self._lease: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self.registrations = 0  # times the record was (re)written under a new lease; for tests and logs

    @property
    def key(self) -> str:
        assert self._record is not None
        return self._prefix + self._record.instance_id

    @property
    def lease_id(self) -> int | None:
        return self._lease

    async def register(self, record: WorkerRecord) -> None:
        """Publish ``record`` and keep it published. If etcd is down now, returns anyway and the
        heartbeat registers as soon as it answers."""
        self._record = record
        if self._closed:  # registering again after a deregister: a fresh connection
            self._client = EtcdClient(self._endpoint, timeout=self._timeout)
            self._closed = False
        try:
            await self._publish(new_lease=True)
        except EtcdUnavailable as exc:
            log.warning("etcd %s unreachable (%s); will register %s when it answers",
                        self._client.endpoint, exc, record.instance_id)
        if self._task is None:
            self._task = asyncio.create_task(self._heartbeat(), name="etcd-registrar")

    async def update(self, record: WorkerRecord) -> None:
        self._record = record
        try:
            await self._publish(new_lease=self._lease is None)
        except EtcdUnavailable as exc:
            log.warning("etcd unreachable (%s); the update of %s waits for it", exc, record.instance_id)
            self._wake.set()

    async def deregister(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._record is not None:
            try:
                await self._client.delete(self.key)
                if self._lease is not None:
                    await self._client.revoke(self._lease)
                log.info("deregistered %s from etcd", self._record.instance_id)
            except EtcdUnavailable as exc:
                log.warning("could not deregister %s (%s); its lease expires within %ds",
                            self._record.instance_id, exc, self._ttl)
        self._lease = None
        await self._client.close()
        self._closed = True

    async def _publish(self, *, new_lease: bool) -> None:
        assert self._record is not None
        if new_lease or self._lease is None:
            self._lease = await self._client.grant(self._ttl)
            self.registrations += 1
            log.info("registered %s in etcd at %s (lease %x, ttl %ds)", self._record.instance_id, self.key,
                     self._lease, self._ttl)
        await self._client.put(self.key, self._record.model_dump_json().encode(), self._lease)

    async def _heartbeat(self) -> None:
        period = self._ttl / 3
        healthy = True
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), period if healthy else self._retry)
            self._wake.clear()
            try:
                await self._beat(repair=not healthy)
                if not healthy:
                    log.info("etcd %s answers again; %s is registered", self._client.endpoint, self.key)
                healthy = True
            except EtcdUnavailable as exc:
                if healthy:
                    log.warning("etcd heartbeat failed (%s); retrying every %.1fs", exc, self._retry)
                healthy = False
            except Exception:
                log.exception("etcd heartbeat failed unexpectedly; retrying")
                healthy = False

    async def _beat(self, *, repair: bool) -> None:
        if self._lease is None:
            await self._publish(new_lease=True)
            return
        remaining = await self._client.keepalive(self._lease)
        if remaining <= 0:
            log.warning("lease %x of %s is gone (expired or revoked); registering again", self._lease,
                        self.key)
            await self._publish(new_lease=True)
        elif repair or await self._client.get(self.key) is None:
            await self._publish(new_lease=False)
