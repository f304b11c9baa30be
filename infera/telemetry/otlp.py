"""OTLP/protobuf encoding of finished spans, written out by hand, and the processor that uses it.

The OTLP exporter builds a protobuf message object per span, attribute and value before serialising;
profiled, that was ~140 µs of CPU per request (five spans), more than the rest of tracing together.
This writes the same ``ExportTraceServiceRequest`` bytes directly (field numbers from
opentelemetry-proto's ``trace/v1/trace.proto`` and ``common/v1/common.proto``), caching the encoded
resource, scope and attribute keys. A test decodes its output with the official classes and compares
it with the SDK encoder's message for the same spans. A request's span records are written by a C
encoder when it is built (csrc/otlp.c: ~3 µs for a routed request's five spans in a loop, against
~12-20 µs here); tests/telemetry/test_native_otlp.py checks it writes the same bytes as this module.
"""

from __future__ import annotations

import logging
import os
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, TraceState

from infera.telemetry.later import Later
from infera.telemetry.spans import Shape, Span, Stage

log = logging.getLogger(__name__)

_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags
_fixed64 = struct.Struct("<Q").pack
_fixed32 = struct.Struct("<I").pack
_double = struct.Struct("<d").pack


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len(field: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    n = len(data)
    if field < 16 and n < 0x80:  # one-byte tag and length: most fields here
        return bytes((field << 3 | 2, n)) + data
    return _varint(field << 3 | 2) + _varint(n) + data


def _value(value: Any) -> bytes:
    """An ``AnyValue``."""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return _len(1, value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64 as two's complement
    if isinstance(value, float):
        return b"\x21" + _double(value)
    if isinstance(value, bytes):
        return _len(7, value)
    if isinstance(value, Sequence):
        return _len(5, b"".join(_len(1, _value(v)) for v in value))
    if isinstance(value, Mapping):
        return _len(6, b"".join(_len(1, _key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"cannot encode an attribute of type {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    return _len(1, key.encode()) + _len(2, _value(value))


_STRINGS_KEPT = 4096  # encoded (key, string value) attributes kept: policies, workers, reasons, paths, ...
_UNIQUE = frozenset({"infera.request_id"})  # string attributes whose values do not repeat: not kept
_UNSET_STATUS = _len(15, b"")
_LOCAL_FLAGS = b"\x85\x01" + _fixed32(_HAS_IS_REMOTE)
_REMOTE_FLAGS = b"\x85\x01" + _fixed32(_HAS_IS_REMOTE | _IS_REMOTE)
_STAGE_TAIL = _UNSET_STATUS + _LOCAL_FLAGS
_INTERNAL = SpanKind.INTERNAL
_ID = struct.Struct(">BBQ").pack  # a span id field (tag, length, 8 bytes big-endian)
_ID_PAIR = struct.Struct(">BBQBBQ").pack  # span id and parent span id fields
_TIMES = struct.Struct("<BQBQ").pack  # start and end time fields (fixed64)


_KeyEncodings = tuple[bytes, bytes, bytes, bytes, bytes]  # see Encoder._key
PURE_PYTHON = "INFERA_PURE_PYTHON"  # set (to anything but 0): no C, here as for the prefix index


def _native_encoder() -> ModuleType | None:
    """The C encoder (``infera.telemetry._otlp``, built from csrc/otlp.c), or None when it is not built or
    ``INFERA_PURE_PYTHON`` is set."""
    if os.environ.get(PURE_PYTHON, "0") not in ("", "0"):
        return None
    try:
        from infera.telemetry import _otlp
    except ImportError:
        return None
    _otlp.setup((SpanKind.INTERNAL, SpanKind.SERVER, SpanKind.CLIENT, SpanKind.PRODUCER, SpanKind.CONSUMER))
    return _otlp


class Encoder:
    """Encodes spans to ``ExportTraceServiceRequest`` bytes; keeps the encodings of keys, resources, scopes,
    span names and string attributes."""

    def __init__(self, native: bool = True) -> None:
        self._native = _native_encoder() if native else None
        self._keys: dict[str, bytes] = {}
        self._span_keys: dict[str, _KeyEncodings] = {}
        self._strings: dict[tuple[str, Any], bytes] = {}  # (key, str or tuple of str)
        self._heads: dict[str, tuple[SpanKind, bytes]] = {}  # by name (an enum's hash is Python code)
        self._events: dict[str, tuple[bytes, bytes]] = {}  # by name: an event's bytes before and after its time
        # by stage shape: its keys' encodings, and its leading strings' encodings by value
        self._shapes: dict[Shape, tuple[int, list[_KeyEncodings], dict[tuple[Any, ...], bytes]]] = {}
        self._resources: dict[int, tuple[Resource, bytes]] = {}
        self._scopes: dict[int, tuple[InstrumentationScope | None, bytes]] = {}

    def _attributes(self, field: int, attributes: Mapping[str, Any] | None) -> bytes:
        if not attributes:
            return b""
        keys = self._keys
        parts = []
        for key, value in attributes.items():
            k = keys.get(key)
            if k is None:
                k = keys[key] = _len(1, key.encode())
            parts.append(_len(field, k + _len(2, _value(value))))
        return b"".join(parts)

    def _resource(self, resource: Resource) -> bytes:
        cached = self._resources.get(id(resource))
        if cached is None or cached[0] is not resource:  # the object is kept, so its id is not reused
            cached = self._resources[id(resource)] = (resource, _len(1, self._attributes(1, resource.attributes)))
        return cached[1]

    def _scope(self, scope: InstrumentationScope | None) -> bytes:
        cached = self._scopes.get(id(scope))
        if cached is None or cached[0] is not scope:
            body = b""
            if scope is not None:
                body = (_len(1, scope.name.encode()) + (_len(2, scope.version.encode()) if scope.version else b"")
                        + self._attributes(3, scope.attributes))
            cached = self._scopes[id(scope)] = (scope, _len(1, body))
        return cached[1]

    def span(self, span: ReadableSpan) -> bytes:
        """One ``Span`` message."""
        ctx = span.context
        assert ctx is not None
        parts = [b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big"), b"\x12\x08" + ctx.span_id.to_bytes(8, "big")]
        state: TraceState | None = ctx.trace_state
        if state:
            parts.append(_len(3, state.to_header().encode()))
        parent = span.parent
        if parent is not None:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        parts.append(_len(5, span.name.encode()))
        parts.append(b"\x30" + bytes((_KIND[span.kind],)))
        parts.append(b"\x39" + _fixed64(span.start_time or 0))
        parts.append(b"\x41" + _fixed64(span.end_time or 0))
        parts.append(self._attributes(9, span.attributes))
        for event in span.events:
            body = b"\x09" + _fixed64(event.timestamp) + _len(2, event.name.encode()) + self._attributes(
                3, event.attributes)
            parts.append(_len(11, body))
        status = span.status
        code = status.status_code.value if status is not None else 0
        description = status.description if status is not None else None
        parts.append(_len(15, (_len(2, description.encode()) if description else b"")
                          + (b"\x18" + bytes((code,)) if code else b"")))
        flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
        parts.append(b"\x85\x01" + _fixed32(flags))
        return b"".join(parts)

    def _key(self, key: str) -> _KeyEncodings:
        """A span attribute key's encodings: the key field, and the ``KeyValue`` prefixes of an int of one
        and of two varint bytes, a float and a bool value (the value's bytes follow)."""
        k = _len(1, key.encode())
        n = len(k)
        if n + 11 >= 0x80:  # a long key: no short prefixes (never, with infera's keys)
            return k, b"", b"", b"", b""
        return (k, bytes((0x4A, n + 4)) + k + b"\x12\x02\x18", bytes((0x4A, n + 5)) + k + b"\x12\x03\x18",
                bytes((0x4A, n + 11)) + k + b"\x12\x09\x21", bytes((0x4A, n + 4)) + k + b"\x12\x02\x10")

    def _span_attributes(self, attributes: Mapping[str, Any]) -> bytes:
        """A span's attributes (field 9): what :meth:`_attributes` writes, from kept encodings of the keys
        and of the (key, string value) pairs; small ints, floats and bools written onto a kept prefix."""
        keys, strings = self._span_keys, self._strings
        parts = []
        for key, value in attributes.items():
            kind = type(value)
            if kind is str or kind is list:  # a list of str (the workers): kept as a tuple
                pair = (key, value) if kind is str else (key, tuple(value))
                try:
                    encoded = strings.get(pair)
                except TypeError:  # a list of lists (not an OTel attribute): written, not kept
                    parts.append(_len(9, self._key(key)[0] + _len(2, _value(value))))
                    continue
                if encoded is None:
                    k = (keys.get(key) or keys.setdefault(key, self._key(key)))[0]
                    encoded = _len(9, k + _len(2, _value(value)))
                    if key not in _UNIQUE:
                        if len(strings) >= _STRINGS_KEPT:
                            strings.clear()
                        strings[pair] = encoded
                parts.append(encoded)
                continue
            entry = keys.get(key)
            if entry is None:
                entry = keys[key] = self._key(key)
            parts.append(self._other(entry, value))
        return b"".join(parts)

    @staticmethod
    def _other(entry: _KeyEncodings, value: Any) -> bytes:
        """A span attribute that is not kept (an int, float, bool, ...), with its key's encodings ``entry``."""
        kind = type(value)
        if kind is int and 0 <= value < 0x4000 and entry[1]:
            return (entry[1] + bytes((value,)) if value < 0x80 else
                    entry[2] + bytes((value & 0x7F | 0x80, value >> 7)))
        if kind is float and entry[3]:
            return entry[3] + _double(value)
        if kind is bool and entry[4]:
            return entry[4] + (b"\x01" if value else b"\x00")
        return _len(9, entry[0] + _len(2, _value(value)))

    def _stage_attributes(self, shape: Shape, values: tuple[Any, ...]) -> bytes:
        """A stage's attributes (field 9), as :meth:`_span_attributes` writes ``shape.attributes(values)``:
        the leading strings' encoding kept as one piece by their values, the rest written onto the keys'
        kept prefixes."""
        plan = self._shapes.get(shape)
        if plan is None:
            keys = self._span_keys
            entries = [keys.get(k) or keys.setdefault(k, self._key(k)) for k in shape.keys]
            plan = self._shapes[shape] = (shape.strings, entries[shape.strings:], {})
        n, tail, kept = plan
        if n:
            head = values[:n]
            encoded = kept.get(head)
            if encoded is None:
                encoded = self._span_attributes(dict(zip(shape.keys[:n], head, strict=True)))
                if len(kept) >= _STRINGS_KEPT:
                    kept.clear()
                kept[head] = encoded
            if not tail:
                return encoded
            parts = [encoded]
        else:
            parts = []
        i = n
        for entry in tail:
            parts.append(self._other(entry, values[i]))
            i += 1
        return b"".join(parts)

    def _head(self, name: str, kind: SpanKind) -> bytes:
        """A span's name and kind fields."""
        kept = self._heads.get(name)
        if kept is None or kept[0] is not kind:
            kept = self._heads[name] = (kind, _len(5, name.encode()) + b"\x30" + bytes((_KIND[kind],)))
        return kept[1]

    def records(self, root: Span, children: Sequence[Span | Stage], bits: Callable[[int], int]) -> bytes:
        """``Span`` messages (each as a ``ScopeSpans.spans`` field) of a request's ended records: the ended
        ``children`` of ``root`` (spans, and stages whose ids ``bits`` makes now), then ``root``; the
        same bytes :meth:`span` writes for their SDK form (:meth:`Tracing.readable`, :func:`stage_span`),
        without making it. Written by the C encoder when it is built (csrc/otlp.c, the same bytes as
        :meth:`_records`), by Python otherwise or where C leaves a request to it (an attribute value of
        a kind it does not write; its stages then draw new ids)."""
        native = self._native
        if native is not None:
            trace_state = root.trace_state
            encoded: bytes | None = native.records(root, children, bits,
                                                   _len(3, trace_state.to_header().encode()) if trace_state else b"")
            if encoded is not None:
                return encoded
        return self._records(root, children, bits)

    def _records(self, root: Span, children: Sequence[Span | Stage], bits: Callable[[int], int]) -> bytes:
        """:meth:`records` in Python, with kept encodings of the pieces that repeat."""
        head_of, attributes = self._head, self._stage_attributes
        trace = b"\x0a\x10" + root.trace_id.to_bytes(16, "big")
        state = _len(3, root.trace_state.to_header().encode()) if root.trace_state else b""
        stage_ids = _ID_PAIR
        parent = root.span_id
        out = []
        for child in children:
            if isinstance(child, tuple):  # a stage: an INTERNAL child of the root, no events, status unset
                name, start, end, shape, values = child
                body = b"".join((trace, stage_ids(0x12, 8, bits(64) or 1, 0x22, 8, parent), state,
                                 head_of(name, _INTERNAL),
                                 _TIMES(0x39, start, 0x41, end), attributes(shape, values) if values else b"",
                                 _STAGE_TAIL))
            else:
                body = self._record(trace, state, child)
            n = len(body)
            out.append((bytes((0x12, n)) if n < 0x80 else bytes((0x12, n & 0x7F | 0x80, n >> 7)) if n < 0x4000
                        else b"\x12" + _varint(n)) + body)
        body = self._record(trace, state, root)
        n = len(body)
        out.append((bytes((0x12, n)) if n < 0x80 else bytes((0x12, n & 0x7F | 0x80, n >> 7)) if n < 0x4000
                    else b"\x12" + _varint(n)) + body)
        return b"".join(out)

    def _record(self, trace: bytes, state: bytes, span: Span) -> bytes:
        """One ended :class:`Span`'s message (``trace`` and ``state``: its trace's id and state fields,
        shared by the spans of a request)."""
        parts = [trace, _ID(0x12, 8, span.span_id), state]
        if span.parent_id:
            parts.append(_ID(0x22, 8, span.parent_id))
        parts += (self._head(span.name, span.kind), _TIMES(0x39, span.start, 0x41, span.end))
        if span.attributes:
            parts.append(self._span_attributes(span.attributes))
        for name, at in span.events:
            event = self._events.get(name)
            if event is None:  # the Event message's tag and length, the time's tag; then its name field
                tail = _len(2, name.encode())
                event = self._events[name] = (_len(11, b"\x09" + bytes(8) + tail)[:-len(tail) - 8], tail)
            parts += (event[0], _fixed64(at), event[1])
        description = span.description
        parts.append(_UNSET_STATUS if description is None else _len(
            15, (_len(2, description.encode()) if description else b"") + b"\x18\x02"))
        parts.append(_REMOTE_FLAGS if span.remote else _LOCAL_FLAGS)
        return b"".join(parts)

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        """The request carrying ``spans``, grouped by resource and instrumentation scope."""
        groups: Groups = {}
        for span in spans:
            self.add(groups, span)
        return self.request(groups)

    def add(self, groups: Groups, span: ReadableSpan) -> None:
        """Encode ``span`` into ``groups`` (by resource, then scope): bytes only, nothing the GC tracks."""
        resource = span.resource
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        scope = span.instrumentation_scope
        scopes.setdefault(id(scope), (scope, []))[1].append(_len(2, self.span(span)))

    def request(self, groups: Groups) -> bytes:
        """The ``ExportTraceServiceRequest`` of spans encoded by :meth:`add`."""
        out = []
        for resource, scopes in groups.values():
            scope_spans = b"".join(_len(2, self._scope(scope) + b"".join(encoded))
                                   for scope, encoded in scopes.values())
            out.append(_len(1, self._resource(resource) + scope_spans))
        return b"".join(out)


Groups = dict[int, tuple[Resource, dict[int, tuple[InstrumentationScope | None, list[bytes]]]]]


class OtlpProcessor(SpanProcessor):
    """A batch span processor for OTLP: a request's span records are encoded as the request ends when
    the C encoder is built; else queued as they are and encoded in batches ``tick`` seconds (by default
    ``delay``) after the first of a batch, or at ``batch`` requests in place; posted by a thread.

    Measured in a loaded frontend, the same Python costs several times more on the request path, among
    everything else a request does, than in a loop over many requests' spans (encoding: ~95 µs per
    request in place against ~20 µs in a loop). Spans queued as SDK objects until a batch was exported
    outlived several garbage collections, doubling them on a busy frontend: here at most ``batch``
    requests' records wait, and what waits for the post is encoded bytes (untracked by the collector).
    The encoding runs on the event loop of the thread that ends the requests
    (:class:`~infera.telemetry.later.Later`): a thread that woke every 0.1 s to do it cost more than the
    encoding, and so did a timer every 0.1 s on a frontend serving tens of requests a second. SDK spans ended elsewhere
    (``on_end``) are encoded by the caller. ``post(body)`` sends one encoded request and returns whether
    it was taken; the posting thread wakes only to post. Batches go out ``delay`` seconds after their
    first span or at ``max_batch`` spans, whichever comes first. A post through the SDK's ``requests``
    client costs ~0.5-1.3 ms of CPU whatever its size: with 512-span batches that was a post every ~90
    requests, so batches are larger.
    """

    def __init__(self, post: Callable[[bytes], bool], shutdown: Callable[[], None] = lambda: None,
                 max_batch: int = 4096, delay: float = 5.0, tick: float | None = None, batch: int = 64) -> None:
        self._post = post
        self._batch = batch
        self._queue: deque[tuple[Resource, InstrumentationScope, Span, Sequence[Span | Stage]]] = deque()
        self._tick = delay if tick is None else min(tick, delay)
        self._bits = random.getrandbits
        self._close = shutdown
        self._max = max_batch
        self._delay = delay
        self._encoder = Encoder()
        self._now = self._encoder._native is not None  # encode each request as it ends (see on_request)
        self._groups: Groups = {}
        self._last: tuple[Resource | None, InstrumentationScope | None, list[bytes], Groups] = (None, None, [], {})
        self._count = 0
        self._first = 0.0  # when the pending batch's first request was queued (monotonic)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._later = Later(self._flush, "infera-otlp-encode")
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="infera-otlp", daemon=True)
        self._thread.start()

    def on_request(self, resource: Resource, scope: InstrumentationScope, root: Span,
                   children: Sequence[Span | Stage]) -> None:
        """Take a request's ended spans (see :meth:`Tracing.emit`): encoded now by the C encoder (~3 µs;
        no records left for the collector to walk), else queued to be encoded in a batch."""
        if not self._stopped:
            queue = self._queue
            if not queue and not self._count:  # a new batch: it is due ``delay`` from now
                self._first = time.monotonic()
            if self._now:  # the C encoder: encoding now costs less than keeping the records for later
                self._take(resource, scope, root, children)
                if self._count >= self._max:
                    self._wake.set()
                else:
                    self._later.soon(self._tick)
                return
            queue.append((resource, scope, root, children))
            if len(queue) >= self._batch:  # busy: encode here, in one go (see the class docstring)
                self._flush()
            else:
                self._later.soon(self._tick)

    def _flush(self) -> None:
        """Encode what is queued; wake the poster when the batch is full or due, else look again when due."""
        self._drain()
        count, first = self._count, self._first
        if not count:
            return
        wait = first + self._delay - time.monotonic()
        if count >= self._max or wait <= 0:
            self._wake.set()
        else:
            self._later.soon(wait)

    def _drain(self) -> None:
        """Encode the queued requests' spans into the pending batch."""
        queue = self._queue
        while True:
            try:
                resource, scope, root, children = queue.popleft()
            except IndexError:
                return
            self._take(resource, scope, root, children)

    def _take(self, resource: Resource, scope: InstrumentationScope, root: Span,
              children: Sequence[Span | Stage]) -> None:
        encoded = self._encoder.records(root, children, self._bits)
        with self._lock:
            last = self._last  # the pending batch's list for the last request's resource and scope: theirs too
            if last[0] is resource and last[1] is scope and last[3] is self._groups:
                last[2].append(encoded)
            else:
                scopes = self._groups.setdefault(id(resource), (resource, {}))[1]
                spans = scopes.setdefault(id(scope), (scope, []))[1]
                spans.append(encoded)
                self._last = (resource, scope, spans, self._groups)
            self._count += len(children) + 1

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopped or span.context is None or not span.context.trace_flags.sampled:
            return
        with self._lock:
            self._encoder.add(self._groups, span)
            if not self._count:
                self._first = time.monotonic()
            self._count += 1
        self._flush()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait()
            self._wake.clear()
            if not self._stopped:
                self._send()

    def _send(self) -> None:
        try:
            self._drain()
        except Exception:  # never let the poster die
            log.exception("could not encode spans for OTLP")
        with self._send_lock:
            with self._lock:
                groups, count = self._groups, self._count
                self._groups, self._count = {}, 0
            if not count:
                return
            try:
                if not self._post(self._encoder.request(groups)):
                    log.warning("the OTLP collector did not take %d spans", count)
            except Exception as exc:  # the exporter's own errors: never let the thread die
                log.warning("could not export %d spans over OTLP: %s", count, exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._send()
        return True

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._later.stop()
        self._wake.set()
        self._thread.join(5.0)
        self._send()
        self._close()


def otlp_exporter() -> SpanExporter:
    """The SDK's OTLP/HTTP span exporter: endpoint, headers, timeout, compression and retries from the
    standard ``OTEL_EXPORTER_OTLP_*`` environment; posting through urllib3 rather than ``requests``
    where that changes nothing (see :func:`lighter_transport`)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter()
    lighter_transport(exporter)
    return exporter


# what ``requests`` reads from the environment and urllib3 does not: with any of them set, requests stays
# (its CA bundle variables are passed on instead)
_REQUESTS_ENV = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NETRC",
                 "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
                 "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER")


def lighter_transport(exporter: SpanExporter) -> bool:
    """Swap the exporter's ``requests`` transport for the SDK's urllib3 one (same retries, headers,
    compression, certificates: the client above the transport is kept). Measured on the loaded 2-core
    box, a post cost ~1.0-1.4 ms of CPU through ``requests`` and ~0.4-0.6 ms through urllib3, once a
    second per process. Not done when ``requests`` would use something urllib3 does not read (a
    proxy, ``.netrc`` credentials, a credential-provider session); the CA bundle ``requests`` would
    take from ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` is given to urllib3. Returns whether it was
    swapped."""
    client = getattr(exporter, "_client", None)
    transport = getattr(client, "_transport", None)
    if transport is None or type(transport).__name__ != "RequestsHTTPTransport":
        return False
    if any(os.environ.get(name) for name in _REQUESTS_ENV) or os.path.exists(os.path.expanduser("~/.netrc")):
        return False
    try:
        from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport
    except ImportError:
        return False
    session = transport._session
    verify = session.verify
    if verify is True:  # what requests would verify against (trust_env)
        verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    client._transport = Urllib3HTTPTransport(verify=verify, cert=session.cert)  # type: ignore[union-attr]
    return True


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        log.warning("ignoring %s=%r: not a number", name, raw)
        return default
    return value if value > 0 else default


def otlp_processor(exporter: SpanExporter) -> SpanProcessor | None:
    """An :class:`OtlpProcessor` posting through ``exporter``'s HTTP client, or None when this SDK's
    exporter keeps no such client (then its own batch processor and encoder serve). The standard
    ``OTEL_BSP_SCHEDULE_DELAY`` (ms; 5000, the specification's default) and
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (spans; 4096 here) bound a batch. A post costs ~0.5 ms of CPU
    whatever its size: with a batch every second, a frontend serving ~20 requests a second paid ~1.5 %
    per request for it in bench/tracing_overhead.py (``otlp-1s``)."""
    client = getattr(exporter, "_client", None)
    if client is None or not callable(getattr(client, "export", None)):
        return None

    def post(body: bytes) -> bool:
        return bool(client.export(body).success)

    return OtlpProcessor(post, exporter.shutdown, max_batch=int(_env_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 4096)),
                         delay=_env_number("OTEL_BSP_SCHEDULE_DELAY", 5000.0) / 1000.0)
