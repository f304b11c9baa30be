"""The fleet-view seam: which workers exist right now, and what changed."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Literal, Protocol

from infera.protocols.worker import WorkerRecord


@dataclasses.dataclass(frozen=True, slots=True)
class FleetChange:
    kind: Literal["add", "update", "remove"]
    worker: WorkerRecord


FleetListener = Callable[[FleetChange], None]

log = logging.getLogger(__name__)


class FleetView(Protocol):
    """A live set of routable workers (listed, reachable, and in a state to serve)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def workers(self) -> dict[str, WorkerRecord]:
        """The current workers by instance id. Cheap; called on every request.

        The mapping is replaced on every change, never mutated (see :class:`WorkerTable`).
        """
        ...

    def subscribe(self, listener: FleetListener) -> None:
        """Call ``listener`` for every change from now on (synchronously, in the event loop)."""
        ...


class Registrar(Protocol):
    """Worker side: publish this worker's record and keep it published.

    ``register`` publishes (and keeps alive, re-publishing after a lost lease or a restarted
    store) until ``deregister``, which removes the record so routers stop sending first.
    """

    async def register(self, record: WorkerRecord) -> None: ...

    async def update(self, record: WorkerRecord) -> None: ...

    async def deregister(self) -> None: ...


class WorkerTable:
    """The workers a FleetView currently holds and the listeners told of every change.

    Every backend keeps one; the mapping is replaced, never mutated, so a reader may hold
    the dict ``workers()`` returned (and compare identities to see whether anything changed).
    A listener that raises is logged and the others still run. ``log_changes`` is off for a
    view layered over another that already logs joins and departures.
    """

    def __init__(self, log_changes: bool = True) -> None:
        self._workers: dict[str, WorkerRecord] = {}
        self._listeners: list[FleetListener] = []
        self._log = log_changes

    def workers(self) -> dict[str, WorkerRecord]:
        return self._workers

    def subscribe(self, listener: FleetListener) -> None:
        self._listeners.append(listener)

    def upsert(self, record: WorkerRecord) -> None:
        """Add or update ``record`` (a no-op when nothing changed)."""
        previous = self._workers.get(record.instance_id)
        if previous == record:
            return
        self._workers = {**self._workers, record.instance_id: record}
        if previous is None and self._log:
            log.info("worker %s joined (%s, %s)", record.instance_id, record.role, record.http_url)
        self._emit(FleetChange("add" if previous is None else "update", record))

    def drop(self, worker_id: str, why: str) -> None:
        record = self._workers.get(worker_id)
        if record is None:
            return
        self._workers = {k: v for k, v in self._workers.items() if k != worker_id}
        if self._log:
            log.warning("worker %s left the fleet: %s", worker_id, why)
        self._emit(FleetChange("remove", record))

    def replace(self, new: Mapping[str, WorkerRecord], why_gone: str) -> None:
        """Make the table equal ``new``, telling listeners of each removal, addition and update."""
        old = self._workers
        if new == old:
            return
        for wid in old:
            if wid not in new:
                self.drop(wid, why_gone)
        for record in new.values():
            self.upsert(record)

    def _emit(self, change: FleetChange) -> None:
        for listener in self._listeners:
            try:
                listener(change)
            except Exception:
                log.exception("fleet listener failed on %s %s", change.kind, change.worker.instance_id)
