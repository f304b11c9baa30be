"""Spans as plain records, handed to the OpenTelemetry SDK's span processor when they end.

The SDK's own ``Tracer.start_span`` costs tens of microseconds per span (a sampler call, a lock,
attribute validation, context objects); a request makes six. Here a span is a small slotted object
while it runs; when it ends it becomes the SDK's :class:`ReadableSpan` (what every processor and
exporter consumes: batch, simple, OTLP, console, in-memory) and goes to the processor's ``on_end``.
The sampler (``OTEL_TRACES_SAMPLER``) is asked once per trace root; children follow their root.
Attributes are the OTLP-safe primitives the callers pass (str, bool, int, float, lists of str).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Decision, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_EMPTY_STATE = TraceState()


def parse_traceparent(header: str | None) -> tuple[int, int, int] | None:
    """``(trace id, parent span id, flags)`` of a W3C ``traceparent`` (version 00 layout), or None if invalid."""
    if not header or len(header) < 55 or header[2] != "-" or header[35] != "-" or header[52] != "-":
        return None
    try:
        version, trace_id, span_id, flags = int(header[:2], 16), int(header[3:35], 16), int(header[36:52], 16), \
            int(header[53:55], 16)
    except ValueError:
        return None
    if version == 0xFF or not trace_id or not span_id or (version == 0 and len(header) != 55):
        return None
    return trace_id, span_id, flags


def traceparent(context: SpanContext) -> str:
    """The W3C ``traceparent`` naming ``context`` as the parent."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


class Span:
    """A span being recorded; :meth:`Tracing.end` ends it (once)."""

    __slots__ = ("attributes", "context", "ended", "events", "kind", "name", "parent", "start", "status")

    def __init__(self, name: str, context: SpanContext, parent: SpanContext | None, kind: SpanKind, start: int,
                 attributes: dict[str, Any]) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.start = start
        self.attributes = attributes
        self.events: list[Event] = []
        self.status = _UNSET
        self.ended = False

    def event(self, name: str) -> None:
        self.events.append(Event(name, None, time.time_ns()))

    def error(self, description: str) -> None:
        self.status = Status(StatusCode.ERROR, description)


class Tracing:
    """Records spans and hands them, ended, to ``processor`` (which exports them as it does for the SDK)."""

    def __init__(self, processor: SpanProcessor, sampler: Sampler = DEFAULT_ON, resource: Resource | None = None,
                 scope: str = "infera") -> None:
        self._processor = processor
        self._sampler = sampler
        self._resource = resource if resource is not None else Resource.create({})
        self._scope = InstrumentationScope(scope)
        self._bits = random.getrandbits  # the module's generator: reseeded in a forked child

    def root(self, name: str, parent_header: str | None, tracestate: str | None = None,
             kind: SpanKind = SpanKind.SERVER, attributes: Mapping[str, Any] | None = None) -> tuple[int, Span | None]:
        """The span beginning this process's part of a trace: a child of the caller's ``traceparent`` if it
        is valid, else the root of a new trace. Returns the trace id and the span, or None when the
        sampler drops the trace (nothing is recorded then)."""
        parent = parse_traceparent(parent_header)
        bits = self._bits
        parent_ctx: SpanContext | None = None
        state = _EMPTY_STATE
        if parent is not None:
            if tracestate:
                state = TraceState.from_header([tracestate])
            parent_ctx = SpanContext(parent[0], parent[1], True, TraceFlags(parent[2] & 1), state)
            trace_id = parent[0]
            context: Context | None = set_span_in_context(NonRecordingSpan(parent_ctx))
        else:
            trace_id = bits(128) or 1
            context = None
        result = self._sampler.should_sample(context, trace_id, name, kind, attributes)
        if result.decision is not Decision.RECORD_AND_SAMPLE:
            return trace_id, None
        ctx = SpanContext(trace_id, bits(64) or 1, False, _SAMPLED, result.trace_state or state)
        return trace_id, Span(name, ctx, parent_ctx, kind, time.time_ns(), dict(attributes or {}))

    def start(self, name: str, parent: Span, kind: SpanKind = SpanKind.INTERNAL,
              attributes: dict[str, Any] | None = None, start: int | None = None) -> Span:
        """A child of ``parent`` (recorded: a sampled parent's children are)."""
        pc = parent.context
        ctx = SpanContext(pc.trace_id, self._bits(64) or 1, False, _SAMPLED, pc.trace_state)
        return Span(name, ctx, pc, kind, start if start is not None else time.time_ns(), attributes or {})

    def end(self, span: Span, end: int | None = None) -> None:
        """End ``span`` and hand it to the processor; a second end does nothing."""
        if span.ended:
            return
        span.ended = True
        self._processor.on_end(ReadableSpan(
            name=span.name, context=span.context, parent=span.parent, resource=self._resource,
            attributes=span.attributes, events=span.events, kind=span.kind, status=span.status,
            start_time=span.start, end_time=end if end is not None else time.time_ns(),
            instrumentation_scope=self._scope))

    def record(self, name: str, parent: Span, start: int, attributes: dict[str, Any] | None = None) -> None:
        """A child of ``parent`` from ``start`` to now, made at once (a synchronous stage)."""
        self.end(self.start(name, parent, SpanKind.INTERNAL, attributes, start))

    def shutdown(self) -> None:
        """Flush and stop the processor (its exporter's last batch goes out)."""
        self._processor.shutdown()
