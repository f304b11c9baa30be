"""Spans as plain records, handed to the OpenTelemetry SDK's span processor when they end.

The SDK's own ``Tracer.start_span`` costs tens of microseconds per span (a sampler call, a lock,
attribute validation, context objects); a request makes six. Here a span is a small slotted object
of ints while it runs; when it ends it becomes the SDK's :class:`ReadableSpan` (what every processor
and exporter consumes: batch, simple, OTLP, console, in-memory) and goes to the processor's
``on_end``. A request's spans can instead be handed over together when its root ends
(:meth:`Tracing.emit`), its synchronous stages as plain :data:`Stage` tuples (their ids made then): a
processor with an ``on_request`` method (the OTLP one) takes them as they are and encodes them off the
request path, with no SDK object made at all. The sampler
(``OTEL_TRACES_SAMPLER``) is asked once per trace root; children follow their root. Attributes are
the OTLP-safe primitives the callers pass (str, bool, int, float, lists of str).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.sampling import (
    DEFAULT_ON,
    Decision,
    ParentBased,
    Sampler,
    StaticSampler,
    TraceIdRatioBased,
)
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
    """A span being recorded: ids as ints, times as epoch nanoseconds (``end`` 0 while open).
    :meth:`Tracing.end` ends and emits it (once); :meth:`close` only ends it, for :meth:`Tracing.emit`.

    ``parent``: a caller's span context (remote), or the id of a span of this process (local: no
    SDK object is made for it unless :attr:`parent` is read), or None for a new trace."""

    __slots__ = ("_context", "_parent", "attributes", "description", "emitted", "end", "events", "kind", "name",
                 "parent_id", "remote", "span_id", "start", "trace_id", "trace_state")

    def __init__(self, name: str, trace_id: int, span_id: int, trace_state: TraceState,
                 parent: SpanContext | int | None, kind: SpanKind, start: int, attributes: dict[str, Any]) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.trace_state = trace_state
        if parent is None or type(parent) is int:  # a new trace's root, or a local parent's id
            self.parent_id = parent or 0
            self.remote = False
            self._parent: SpanContext | None = None
        else:
            self.parent_id = parent.span_id  # type: ignore[union-attr]
            self.remote = parent.is_remote  # type: ignore[union-attr]
            self._parent = parent  # type: ignore[assignment]
        self.kind = kind
        self.start = start
        self.end = 0
        self.attributes = attributes
        self.events: list[tuple[str, int]] = []  # (name, epoch ns)
        self.description: str | None = None  # an error's, when the span failed
        self.emitted = False
        self._context: SpanContext | None = None

    @property
    def context(self) -> SpanContext:
        ctx = self._context
        if ctx is None:
            ctx = self._context = SpanContext(self.trace_id, self.span_id, False, _SAMPLED, self.trace_state)
        return ctx

    @property
    def parent(self) -> SpanContext | None:
        """The parent's span context (None for a new trace)."""
        if self._parent is None and self.parent_id:
            self._parent = SpanContext(self.trace_id, self.parent_id, False, _SAMPLED, self.trace_state)
        return self._parent

    @property
    def status(self) -> Status:
        return _UNSET if self.description is None else Status(StatusCode.ERROR, self.description)

    def event(self, name: str) -> None:
        self.events.append((name, time.time_ns()))

    def error(self, description: str) -> None:
        self.description = description

    def close(self, end: int | None = None) -> None:
        """End the span without handing it over (:meth:`Tracing.emit` does); a second close does nothing."""
        if not self.end:
            self.end = end if end is not None else time.time_ns()


class Shape:
    """The attribute keys of one kind of stage, in order: a stage carries only their values (no dict per
    stage), and the OTLP encoder keeps the encoding of a stage's leading ``strings`` values together (a
    pick's role, policy, worker and reason repeat from request to request). Its first ``strings``
    values are always str. Shapes are module constants: one object per kind."""

    __slots__ = ("keys", "strings")

    def __init__(self, keys: tuple[str, ...], strings: int = 0) -> None:
        if not 0 <= strings <= len(keys):
            raise ValueError(f"strings={strings} for {len(keys)} keys")
        self.keys = keys
        self.strings = strings

    def attributes(self, values: tuple[Any, ...]) -> dict[str, Any]:
        """The attributes ``values`` stand for (the SDK form)."""
        return dict(zip(self.keys, values, strict=True))


Stage = tuple[str, int, int, Shape, tuple[Any, ...]]
"""A closed ``INTERNAL`` child of a request's root: (name, start, end (epoch ns), attribute keys, their
values)."""


def stage_span(root: Span, stage: Stage, bits: Any = random.getrandbits) -> Span:
    """The :class:`Span` of a stage of ``root``'s request (its id made now), ended and not yet emitted."""
    name, start, end, shape, values = stage
    span = Span(name, root.trace_id, bits(64) or 1, root.trace_state, root.span_id, SpanKind.INTERNAL, start,
                shape.attributes(values))
    span.end = end
    span.emitted = True
    return span


class RequestSink(Protocol):
    """A span processor that takes a request's span records as they are (see OtlpProcessor)."""

    def on_request(self, resource: Resource, scope: InstrumentationScope, root: Span,
                   children: Sequence[Span | Stage]) -> None: ...


_LOW_64 = (1 << 64) - 1


def root_bound(sampler: Sampler) -> int | None:
    """For a sampler whose decision on a new trace (no parent) is the SDK's trace-id ratio rule, the
    bound: a new trace is sampled when its id's low 64 bits are below it (2**64: always, 0: never).
    None for any other sampler (it is asked). Covers the standard ``OTEL_TRACES_SAMPLER`` values."""
    # _root and _decision are the SDK's private fields: an SDK without them gets its sampler asked
    if isinstance(sampler, ParentBased) and type(sampler).should_sample is ParentBased.should_sample:
        root: Sampler | None = getattr(sampler, "_root", None)  # a new trace has no parent: the root decides
        if root is None:
            return None
        sampler = root
    if type(sampler) is TraceIdRatioBased:
        return sampler.bound
    if isinstance(sampler, StaticSampler) and type(sampler).should_sample is StaticSampler.should_sample:
        decision = getattr(sampler, "_decision", None)
        if decision is not None:
            return 1 << 64 if decision is Decision.RECORD_AND_SAMPLE else 0
    return None


class Tracing:
    """Records spans and hands them, ended, to ``processor`` (which exports them as it does for the SDK)."""

    def __init__(self, processor: SpanProcessor, sampler: Sampler = DEFAULT_ON, resource: Resource | None = None,
                 scope: str = "infera") -> None:
        self._processor = processor
        self._sink: RequestSink | None = processor if callable(getattr(processor, "on_request", None)) else None  # type: ignore[assignment]
        self._sampler = sampler
        self._root_bound = root_bound(sampler)
        self._resource = resource if resource is not None else Resource.create({})
        self._scope = InstrumentationScope(scope)
        self._bits = random.getrandbits  # the module's generator: reseeded in a forked child

    def root(self, name: str, parent_header: str | None, tracestate: str | None = None,
             kind: SpanKind = SpanKind.SERVER, attributes: Mapping[str, Any] | None = None) -> tuple[int, Span | None]:
        """The span beginning this process's part of a trace: a child of the caller's ``traceparent`` if it
        is valid, else the root of a new trace. Returns the trace id and the span, or None when the
        sampler drops the trace (nothing is recorded then)."""
        parent = parse_traceparent(parent_header) if parent_header else None
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
            bound = self._root_bound
            if bound is not None:  # the sampler's decision for a new trace, without calling it
                if trace_id & _LOW_64 >= bound:
                    return trace_id, None
                return trace_id, Span(name, trace_id, bits(64) or 1, state, None, kind, time.time_ns(),
                                      dict(attributes or {}))
            context = None
        result = self._sampler.should_sample(context, trace_id, name, kind, attributes)
        if result.decision is not Decision.RECORD_AND_SAMPLE:
            return trace_id, None
        return trace_id, Span(name, trace_id, bits(64) or 1, result.trace_state or state, parent_ctx, kind,
                              time.time_ns(), dict(attributes or {}))

    def start(self, name: str, parent: Span, kind: SpanKind = SpanKind.INTERNAL,
              attributes: dict[str, Any] | None = None, start: int | None = None) -> Span:
        """A child of ``parent`` (recorded: a sampled parent's children are)."""
        return Span(name, parent.trace_id, self._bits(64) or 1, parent.trace_state, parent.span_id, kind,
                    start if start is not None else time.time_ns(), attributes or {})

    def end(self, span: Span, end: int | None = None) -> None:
        """End ``span`` (if open) and hand it to the processor; a second end does nothing."""
        if span.emitted:
            return
        span.close(end)
        self.emit(span, ())

    def emit(self, root: Span, children: Sequence[Span | Stage]) -> None:
        """Hand over ``root``, ended, and its ended ``children`` (spans not yet emitted, and stages)."""
        root.emitted = True
        for child in children:
            if type(child) is not tuple:  # a Span (a stage is a tuple)
                child.emitted = True  # type: ignore[union-attr]
        if self._sink is not None:
            self._sink.on_request(self._resource, self._scope, root, children)
            return
        on_end = self._processor.on_end
        for child in children:
            on_end(self.readable(child if isinstance(child, Span) else stage_span(root, child, self._bits)))
        on_end(self.readable(root))

    def readable(self, span: Span) -> ReadableSpan:
        """The SDK's form of an ended span."""
        return ReadableSpan(
            name=span.name, context=span.context, parent=span.parent, resource=self._resource,
            attributes=span.attributes, events=[Event(n, None, t) for n, t in span.events], kind=span.kind,
            status=span.status, start_time=span.start, end_time=span.end, instrumentation_scope=self._scope)

    def shutdown(self) -> None:
        """Flush and stop the processor (its exporter's last batch goes out)."""
        self._processor.shutdown()
