"""etcd discovery: the fleet is whatever lives under ``/infera/workers/``.

Workers put their record (JSON, see :mod:`infera.protocols.worker`) at
``/infera/workers/<instance id>`` under a lease they keep alive; a worker that dies stops
heartbeating and etcd deletes its key when the lease expires. This view lists the prefix
once, then watches it from the listing's revision, so a new worker is routable as soon as
its put is applied (milliseconds) and a dead one leaves within its lease TTL.

While etcd is unreachable the view keeps the last fleet it knew (routing goes on) and
retries with backoff. On reconnection it resumes the watch from the revision after the
last one it applied, so nothing is missed; if etcd compacted that revision away, or the
store was replaced (its revision went backwards), it relists and emits the difference.

A record that is not JSON, fails validation, or carries a ``version`` this build does not
understand is skipped with one log line per revision; it never stops the watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from pydantic import ValidationError

from infera.discovery.base import FleetListener, WorkerTable
from infera.discovery.etcd_client import (
    WORKERS_PREFIX,
    EtcdClient,
    EtcdCompacted,
    EtcdUnavailable,
    KeyValue,
)
from infera.protocols.worker import RECORD_VERSION, WorkerRecord

log = logging.getLogger(__name__)


class RecordError(ValueError):
    """A value under the prefix is not a record this build can route to."""


def decode_record(value: bytes) -> WorkerRecord:
    try:
        doc = json.loads(value)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RecordError("not a JSON object")
    version = doc.get("version", RECORD_VERSION)
    if version != RECORD_VERSION:
        raise RecordError(f"record version {version!r} is not {RECORD_VERSION} (newer worker?)")
    try:
        return WorkerRecord.model_validate(doc)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, e["loc"])) + ": " + e["msg"] for e in exc.errors()[:3])
        raise RecordError(f"invalid record ({fields})") from exc


class EtcdFleet:
    def __init__(self, endpoint: str, *, prefix: str = WORKERS_PREFIX, timeout: float = 2.0,
                 retry_max: float = 2.0) -> None:
        self._client = EtcdClient(endpoint, timeout=timeout)
        self._prefix = prefix
        self._retry_max = retry_max
        self._table = WorkerTable()
        self._by_key: dict[str, str] = {}  # etcd key -> instance id
        self._revision = 0  # last revision applied to the view
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()  # set while the watch is live
        self.relists = 0  # full listings done (initial one included); for tests and logs

    def workers(self) -> dict[str, WorkerRecord]:
        return self._table.workers()

    def subscribe(self, listener: FleetListener) -> None:
        self._table.subscribe(listener)

    @property
    def revision(self) -> int:
        return self._revision

    async def start(self) -> None:
        try:
            await self._relist()
        except EtcdUnavailable as exc:  # start serving anyway; the loop keeps trying
            log.warning("etcd %s unreachable at start (%s); waiting for it", self._client.endpoint, exc)
        self._task = asyncio.create_task(self._run(), name="etcd-fleet")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._client.close()

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                if self._revision == 0:
                    await self._relist()
                elif await self._client.revision() < self._revision:
                    log.warning("etcd revision went backwards (store replaced?); relisting")
                    await self._relist()
                await self._watch()
            except EtcdCompacted as exc:
                log.info("etcd watch from revision %d: %s; relisting", self._revision + 1, exc)
                self._revision = 0
                continue
            except EtcdUnavailable as exc:
                if self.synced.is_set():
                    log.warning("etcd %s unreachable (%s); keeping the last view of %d workers",
                                self._client.endpoint, exc, len(self._table.workers()))
                    delay = 0.1
                self.synced.clear()
            except Exception:  # a bug here must not silently freeze the view forever
                log.exception("etcd watcher failed; restarting it")
                self.synced.clear()
            await asyncio.sleep(delay)
            delay = min(self._retry_max, delay * 2)

    async def _watch(self) -> None:
        stream = await self._client.watch_prefix(self._prefix, self._revision + 1)
        log.info("etcd %s: watching %s from revision %d", self._client.endpoint, self._prefix, self._revision + 1)
        self.synced.set()
        async for event in stream:
            if event.kind == "put":
                self._apply_put(KeyValue(event.key, event.value, event.revision))
            else:
                self._apply_delete(event.key)
            self._revision = max(self._revision, event.revision)

    async def _relist(self) -> None:
        revision, items = await self._client.list_prefix(self._prefix)
        self.relists += 1
        seen = {kv.key for kv in items}
        for key in [k for k in self._by_key if k not in seen]:
            self._apply_delete(key)
        for kv in items:
            self._apply_put(kv)
        self._revision = revision
        log.info("etcd %s: %d workers listed at revision %d", self._client.endpoint, len(self._table.workers()),
                 revision)

    def _apply_put(self, kv: KeyValue) -> None:
        try:
            record = decode_record(kv.value)
        except RecordError as exc:
            log.warning("etcd key %s (revision %d) skipped: %s", kv.key, kv.mod_revision, exc)
            self._apply_delete(kv.key)  # whatever it held before is no longer a usable record
            return
        old_id = self._by_key.get(kv.key)
        if old_id is not None and old_id != record.instance_id:
            self._apply_delete(kv.key)
        self._by_key[kv.key] = record.instance_id
        self._table.upsert(record)

    def _apply_delete(self, key: str) -> None:
        worker_id = self._by_key.pop(key, None)
        if worker_id is None or worker_id in self._by_key.values():
            return
        self._table.drop(worker_id, f"its etcd key {key} is gone")
