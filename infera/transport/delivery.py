"""Handing one KV-event batch from the wire to the router, the same for every event source.

A batch that does not decode is dropped with a warning. A batch that decodes but cannot be applied
(the sink raised: say a token id the router's block hashing refuses) is dropped too, and counted as
one lost batch so the worker's cache view is reset rather than left half-applied; the stream goes on
either way, so one bad batch never ends a worker's events for good.
"""

from __future__ import annotations

import logging

from infera.protocols.kv_events import KvEventDecodeError, decode_batch
from infera.transport.base import EventSink, GapSink

log = logging.getLogger("infera.transport.events")


def deliver(worker_id: str, payload: bytes, sink: EventSink, on_gap: GapSink) -> None:
    try:
        batch = decode_batch(payload)
    except KvEventDecodeError as exc:
        log.warning("worker %s: undecodable KV-event batch: %s", worker_id, exc)
        return
    try:
        sink(worker_id, batch)
    except Exception:
        log.exception("worker %s: a KV-event batch could not be applied; its cache view is reset", worker_id)
        on_gap(worker_id, 1)
