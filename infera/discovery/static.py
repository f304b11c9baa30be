"""Static discovery: worker URLs from flags or a watched JSON file.

Each entry is a base URL (the worker's record is read from ``GET <url>/infera/worker``,
which the mock engine and infera's worker wrappers serve) or an object with the record's
fields (for an engine that serves no record: at least ``http_url`` and ``model``; the
instance id defaults to the URL). Every ``poll_interval`` each worker is checked with one GET:
its record's (answered by the same server as its ``/health``; a worker that cannot answer it is
not routable) or, for an object entry, ``/health``. A worker is in the view while its record is
known and its check answers 200; it leaves after ``unhealthy_after`` failed checks. A record whose
JSON equals the last check's is not validated again: JSON values that Python holds equal (``1``,
``1.0``, ``true``) validate the same for every field of the record (pydantic's lax int and bool;
tests/discovery/test_static_checks.py pins it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import ValidationError

from infera.discovery.base import FleetListener, WorkerTable
from infera.protocols.worker import WorkerRecord

log = logging.getLogger(__name__)

GetJson = Callable[[str, float], Awaitable[object]]
"""Fetch a URL's JSON body with a timeout (seconds); raises on failure."""


class WorkersFileError(ValueError):
    pass


def parse_workers_file(text: str) -> list[str | dict[str, Any]]:
    """A JSON list of URLs or record objects, or ``{"workers": [...]}``."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkersFileError(f"not JSON: {exc}") from exc
    if isinstance(doc, dict):
        doc = doc.get("workers")
    if not isinstance(doc, list) or not all(isinstance(x, str | dict) for x in doc):
        raise WorkersFileError("expected a list of worker URLs or worker objects")
    return doc


class StaticFleet:
    def __init__(
        self,
        get_json: GetJson,
        urls: Sequence[str] = (),
        workers_file: str = "",
        poll_interval: float = 2.0,
        unhealthy_after: int = 2,
        timeout: float = 2.0,
    ) -> None:
        self._get_json = get_json
        self._urls = list(urls)
        self._file = workers_file
        self._file_mtime: float | None = None
        self._file_entries: list[str | dict[str, Any]] = []
        self._poll = poll_interval
        self._unhealthy_after = unhealthy_after
        self._timeout = timeout
        self._table = WorkerTable()
        self._by_entry: dict[str, str] = {}  # entry key (url) -> instance id
        self._failures: dict[str, int] = {}
        self._records: dict[str, tuple[object, WorkerRecord]] = {}  # entry key -> last raw record, validated
        self._task: asyncio.Task[None] | None = None

    def workers(self) -> dict[str, WorkerRecord]:
        return self._table.workers()

    def subscribe(self, listener: FleetListener) -> None:
        self._table.subscribe(listener)

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="static-fleet")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._poll)
            try:
                await self.refresh()
            except Exception:
                log.exception("static discovery refresh failed")

    def _entries(self) -> list[str | dict[str, Any]]:
        if self._file:
            try:
                mtime = os.stat(self._file).st_mtime
                if mtime != self._file_mtime:
                    with open(self._file, encoding="utf-8") as fh:
                        self._file_entries = parse_workers_file(fh.read())
                    self._file_mtime = mtime
            except (OSError, WorkersFileError) as exc:
                log.warning("workers file %s unreadable, keeping the last list: %s", self._file, exc)
        return [*self._urls, *self._file_entries]

    async def refresh(self) -> None:
        """Re-read the entries and check every worker once (concurrently)."""
        entries = self._entries()
        keys = {_entry_key(e) for e in entries}
        for key in list(self._by_entry):
            if key not in keys:
                self._drop(self._by_entry.pop(key), "removed from the list")
        for key in [k for k in self._records if k not in keys]:
            del self._records[key]
        await asyncio.gather(*(self._check(e) for e in entries))

    async def _check(self, entry: str | dict[str, Any]) -> None:
        key = _entry_key(entry)
        base = key.rstrip("/")
        try:
            if isinstance(entry, str):  # its record, which answers for its health too
                raw: object = await self._get_json(base + "/infera/worker", self._timeout)
            else:
                await self._get_json(base + "/health", self._timeout)
                raw = {"instance_id": base, "http_url": base, **entry}
            record = self._record(key, raw)
        except ValidationError as exc:
            log.warning("worker %s has an invalid record: %s", key, exc.errors()[:2])
            self._fail(key)
            return
        except Exception as exc:  # unreachable, non-200, bad JSON: all mean "not routable now"
            log.debug("worker %s not healthy: %s", key, exc)
            self._fail(key)
            return
        self._failures.pop(key, None)
        old_id = self._by_entry.get(key)
        if old_id is not None and old_id != record.instance_id:
            self._drop(old_id, "restarted with a new instance id")
        self._by_entry[key] = record.instance_id
        if self._table.workers().get(record.instance_id) is not record:
            self._table.upsert(record)

    def _record(self, key: str, raw: object) -> WorkerRecord:
        """``raw`` validated, or the record validated from the same JSON at the entry's last check."""
        last = self._records.get(key)
        if last is not None and last[0] == raw:  # ~1 us; validating costs ~12 (measured, bench/README.md)
            return last[1]
        record = WorkerRecord.model_validate(raw)
        self._records[key] = (raw, record)
        return record

    def _fail(self, key: str) -> None:
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        worker_id = self._by_entry.get(key)
        if worker_id is not None and count >= self._unhealthy_after:
            self._by_entry.pop(key, None)
            self._drop(worker_id, f"failed {count} health checks")

    def _drop(self, worker_id: str, why: str) -> None:
        self._table.drop(worker_id, why)


def _entry_key(entry: str | dict[str, Any]) -> str:
    if isinstance(entry, str):
        return entry
    return str(entry.get("http_url") or entry.get("url") or "")
