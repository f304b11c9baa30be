"""Beginning and ending a request's telemetry: the root span (continuing a caller's W3C trace), the
record, and at the end the request log line.

A :class:`Telemetry` with no tracing and no request log is inactive: the server installs no middleware
for it and every hook below sees no record.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import SpanKind

from infera.telemetry.logs import RequestLog
from infera.telemetry.record import RequestRecord
from infera.telemetry.spans import Tracing, parse_traceparent


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a valid W3C ``traceparent`` header, or ""."""
    parsed = parse_traceparent(traceparent)
    return f"{parsed[0]:032x}" if parsed is not None else ""


class Telemetry:
    """``tracing``: spans are recorded (as its sampler says); ``log``: one line per request."""

    def __init__(self, tracing: Tracing | None = None, log: RequestLog | None = None) -> None:
        self.tracing = tracing
        self.log = log

    @property
    def active(self) -> bool:
        return self.tracing is not None or self.log is not None

    def begin(self, name: str, traceparent: str | None, request_id: str | None,
              attributes: Mapping[str, Any] | None = None, tracestate: str | None = None,
              kind: SpanKind = SpanKind.SERVER) -> RequestRecord:
        """A new request's record; its root span (when traced) continues ``traceparent`` if valid."""
        rid = request_id or os.urandom(8).hex()
        tracing = self.tracing
        if tracing is None:
            return RequestRecord(rid, trace_id_of(traceparent))
        trace_id, root = tracing.root(name, traceparent, tracestate, kind, attributes)
        if root is not None:
            root.attributes["infera.request_id"] = rid
        return RequestRecord(rid, trace_id, tracing, root)  # the id's hex digits only if read (logs)

    def end(self, record: RequestRecord, path: str) -> None:
        record.finish()
        if self.log is not None:
            self.log.write(record, path)
