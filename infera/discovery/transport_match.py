"""Keep workers whose transports do not match the frontend's out of the fleet, and say so.

A worker started with ``--request-transport http`` under a frontend on ``nats`` (or the
reverse, and likewise for KV events) would otherwise show up as silent timeouts. Its record
tells: ``nats_subject`` is set exactly when it takes requests over NATS, ``nats_kv_subject``
when its KV events are relayed there. Such a worker is left out of the view the router sees,
with one warning line per worker and reason.
"""

from __future__ import annotations

import logging

from infera.discovery.base import FleetChange, FleetListener, FleetView, WorkerTable
from infera.protocols.worker import WorkerRecord

log = logging.getLogger(__name__)


def mismatch(worker: WorkerRecord, request_transport: str, kv_event_transport: str | None) -> str | None:
    """Why this frontend cannot use ``worker`` (None when it can).

    ``kv_event_transport`` is None when the frontend reads no KV events (its policy needs none).
    """
    on_nats = bool(worker.nats_subject)
    if request_transport == "nats" and not on_nats:
        return ("its record has no nats_subject (the worker runs --request-transport http) but this frontend runs "
                "--request-transport nats")
    if request_transport == "http" and on_nats:
        return (f"it takes requests on NATS ({worker.nats_subject}) but this frontend runs --request-transport "
                "http")
    if kv_event_transport == "nats" and worker.kv_events is not None and not worker.nats_kv_subject:
        return ("it publishes KV events over ZMQ only (the worker runs --kv-event-transport zmq) but this frontend "
                "runs --kv-event-transport nats")
    if kv_event_transport == "zmq" and worker.nats_kv_subject:
        return (f"its KV events go to NATS ({worker.nats_kv_subject}) but this frontend runs "
                "--kv-event-transport zmq")
    return None


class TransportMatchedFleet:
    """A :class:`FleetView` of the workers of ``inner`` whose transports match this frontend's."""

    def __init__(self, inner: FleetView, request_transport: str, kv_event_transport: str | None) -> None:
        self._inner = inner
        self._request_transport = request_transport
        self._kv_event_transport = kv_event_transport
        self._table = WorkerTable(log_changes=False)  # the inner view logs joins and departures
        self._warned: dict[str, str] = {}  # worker id -> the reason last logged
        inner.subscribe(self._on_change)

    def workers(self) -> dict[str, WorkerRecord]:
        return self._table.workers()

    def subscribe(self, listener: FleetListener) -> None:
        self._table.subscribe(listener)

    async def start(self) -> None:
        await self._inner.start()
        for worker in list(self._inner.workers().values()):
            if worker.instance_id not in self._table.workers():
                self._on_change(FleetChange("add", worker))

    async def stop(self) -> None:
        await self._inner.stop()

    def _on_change(self, change: FleetChange) -> None:
        worker = change.worker
        wid = worker.instance_id
        if change.kind == "remove":
            self._warned.pop(wid, None)
            self._table.drop(wid, "gone from the fleet")
            return
        reason = mismatch(worker, self._request_transport, self._kv_event_transport)
        if reason is None:
            self._warned.pop(wid, None)
            self._table.upsert(worker)
            return
        if self._warned.get(wid) != reason:
            self._warned[wid] = reason
            log.warning("worker %s is not routed to: %s. Start the worker and the frontend with the same "
                        "--request-transport and --kv-event-transport", wid, reason)
        self._table.drop(wid, reason)
