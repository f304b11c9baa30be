"""Handing one KV-event batch from the wire to the router, the same for every event source.

A raw sink, if the router gave one, is offered the payload first and may take the batch whole without
decoding it here (the index applies vLLM's common form straight from the bytes); when it declines, having
changed nothing, the batch is decoded for the sink as always. A batch that does not decode is dropped with a
warning. A batch that cannot be applied (a sink raised: say a token id the router's block hashing refuses) is
dropped too, and counted as one lost batch so the worker's cache view is reset rather than left half-applied;
the stream goes on either way, so one bad batch never ends a worker's events for good.
"""

from __future__ import annotations

import logging

from infera.protocols.kv_events import KvEventDecodeError, decode_batch
from infera.transport.base import EventSink, GapSink, RawSink

log = logging.getLogger("infera.transport.events")


def deliver(worker_id: str, payload: bytes, sink: EventSink, on_gap: GapSink, raw: RawSink | None = None) -> None:
    if raw is not None:
        try:
            if raw(worker_id, payload):
                return
        except Exception:
            _lost(worker_id, on_gap)
            return
    try:
        batch = decode_batch(payload)
    except KvEventDecodeError as exc:
        log.warning("worker %s: undecodable KV-event batch: %s", worker_id, exc)
        return
    try:
        sink(worker_id, batch)
    except Exception:
        _lost(worker_id, on_gap)


def failed(worker_id: str, exc: BaseException, on_gap: GapSink) -> None:
    """A batch's apply raised ``exc`` elsewhere (a socket's drain): what :func:`deliver` does for a raising sink."""
    _lost(worker_id, on_gap, exc)


def _lost(worker_id: str, on_gap: GapSink, exc: BaseException | None = None) -> None:
    """A batch could not be applied (``exc``'s traceback logged, by default the one being handled), one batch lost
    for the worker."""
    log.error("worker %s: a KV-event batch could not be applied; its cache view is reset", worker_id,
              exc_info=True if exc is None else exc)
    on_gap(worker_id, 1)
