"""Beginning and ending a request's telemetry: the root span (continuing a caller's W3C trace), the
record, and at the end the request log line.

A :class:`Telemetry` with no tracer and no request log is inactive: the server installs no middleware
for it and every hook below sees no record.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Span, SpanKind, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from infera.telemetry.logs import RequestLog
from infera.telemetry.record import RequestRecord

_PROPAGATOR = TraceContextTextMapPropagator()


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a W3C ``traceparent`` header (``00-<trace id>-<span id>-<flags>``), or ""."""
    if traceparent and len(traceparent) >= 55 and traceparent[2] == "-":
        return traceparent[3:35]
    return ""


def continue_span(tracer: Tracer, name: str, traceparent: str | None, tracestate: str | None = None,
                  kind: SpanKind = SpanKind.SERVER, attributes: Mapping[str, Any] | None = None) -> Span:
    """A span continuing the caller's W3C trace (``traceparent``), or the root of a new one."""
    parent = None
    if traceparent:
        carrier = {"traceparent": traceparent}
        if tracestate:
            carrier["tracestate"] = tracestate
        parent = _PROPAGATOR.extract(carrier)
    return tracer.start_span(name, parent, kind=kind, attributes=attributes)


class Telemetry:
    """``tracer``: spans are made (subject to its provider's sampler); ``log``: one line per request."""

    def __init__(self, tracer: Tracer | None = None, log: RequestLog | None = None) -> None:
        self.tracer = tracer
        self.log = log

    @property
    def active(self) -> bool:
        return self.tracer is not None or self.log is not None

    def begin(self, name: str, traceparent: str | None, request_id: str | None,
              attributes: Mapping[str, Any] | None = None, tracestate: str | None = None,
              kind: SpanKind = SpanKind.SERVER) -> RequestRecord:
        """A new request's record; its root span (when tracing) continues ``traceparent`` if given."""
        rid = request_id or os.urandom(8).hex()
        tracer = self.tracer
        if tracer is None:
            return RequestRecord(rid, trace_id_of(traceparent))
        root = continue_span(tracer, name, traceparent, tracestate, kind, attributes)
        trace_id = f"{root.get_span_context().trace_id:032x}"
        if not root.is_recording():  # not sampled: no child spans at all
            return RequestRecord(rid, trace_id)
        root.set_attribute("infera.request_id", rid)
        return RequestRecord(rid, trace_id, tracer, root, set_span_in_context(root))

    def end(self, record: RequestRecord, path: str) -> None:
        record.finish()
        if self.log is not None:
            self.log.write(record, path)
