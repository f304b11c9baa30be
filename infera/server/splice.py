"""A stream's body written straight to the client's transport from the upstream's callback (the
:class:`~infera.server.relay.BodyWriter` of a lean request, :mod:`infera.server.lean`).

At real-time decode speed each output token is its own upstream read, and relayed through the ASGI
``send`` it was a wake-up of the request's task, an awaited ``send`` per wrapper (``Observe``'s, the
request id's, uvicorn's) and a message dict (bench/README.md, "Issue 15, twelfth round: routing_quality's
CPU per request, diagnosed"). The writer does to a body piece what those sends did, in one synchronous
call: ``Observe``'s look at the body, then uvicorn's chunked write and, at the end, its completion of the
cycle (keep-alive, the next pipelined request). The response's start still goes through ``send``; the
request id's and the drain's wrappers only touch the start. Where the C extension is built, :meth:`CycleWriter.splice`
hands the relay a sink doing its per-chunk work and this write in one call (csrc/splice.c; bench/README.md, "Issue 15,
fifteenth round: a streamed chunk's relay work in one C call").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from infera.kv.native import load
from infera.server.coalesce import HeadHold
from infera.server.metrics import Buckets
from infera.server.observe import Observation
from infera.server.relay import Spliced
from infera.server.request_id import HEADER
from infera.server.tally import StreamTally

_native = load()  # ChunkSink (csrc/splice.c), or None: the relay's Python sink


# the bytes uvicorn's HEADER_RE (a name's) and HEADER_VALUE_RE (a value's) refuse, each regex a one-byte class
NAME_BYTES = bytes(b for b in range(256) if HEADER_RE.search(bytes((b,))))
VALUE_BYTES = bytes(b for b in range(256) if HEADER_VALUE_RE.search(bytes((b,))))


class CycleWriter:
    """:class:`~infera.server.relay.BodyWriter` over one uvicorn request cycle (chunked bodies only).

    Given the lean path's ``rid`` (the response's ``x-request-id``), ``closing`` (the drain's ``Connection: close``)
    and ``hold`` (what puts the cycle's :class:`HeadHold` on), it also writes a stream's start, :meth:`start`."""

    __slots__ = ("_closing", "_cycle", "_hold", "_observation", "_out", "_rid")

    def __init__(self, cycle: RequestResponseCycle, observation: Observation | None, rid: bytes | None = None,
                 closing: bool = False, hold: Callable[[RequestResponseCycle], None] | None = None) -> None:
        self._cycle = cycle
        self._observation = observation
        self._rid = rid
        self._closing = closing
        self._hold = hold
        self._out: Any = None  # the transport a chunk is written to, once known (see _transport)

    def start(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, more: bool) -> bool:
        """The response's start and its first body piece (``more`` False: the whole body) in one write, as the lean
        path's sends wrote them (``Observe``'s look, the request id's header, uvicorn's head and chunked body, the
        head held for the body): the same bytes, without an ASGI message, a wrapper's frame or a :class:`HeadHold`.
        False when it does not apply: no body yet, a client not taking more now, a request id not given, the drain's
        close, a head that is not a plain chunked 2xx/3xx one (a header naming the framing or the connection, or one
        uvicorn would refuse); then nothing is written, the cycle gets its hold, and the caller sends them."""
        cycle = self._cycle
        rid = self._rid
        if (rid is None or self._closing or not body or status >= 400 or status in (204, 304) or cycle.response_started
                or cycle.disconnected or cycle.flow.write_paused or cycle.scope["method"] == "HEAD"):
            return self._decline()
        pairs = [*cycle.default_headers, *headers, (HEADER, rid)]  # uvicorn's defaults, the app's, the id's
        # uvicorn's checks, each a one-byte class: the names (values) joined by a byte outside it hold one of its
        # bytes when one of them does; ``translate`` drops those bytes in one C loop (a regex's class costs ~20x)
        names = b"a".join([name for name, _ in pairs])
        values = b"a".join([value for _, value in pairs])
        if (len(names.translate(None, NAME_BYTES)) != len(names)
                or len(values.translate(None, VALUE_BYTES)) != len(values)):
            return self._decline()  # uvicorn's send raises its error
        names = names.lower()  # find, not `in`: on 3.11 `bytes in bytes` makes and drops a TypeError first
        find = names.find
        if find(b"content-length") >= 0 or find(b"transfer-encoding") >= 0 or find(b"connection") >= 0:
            return self._decline()  # a framing or connection of the app's own (none of infera's streams): uvicorn's
        if self._observation is not None:
            self._observation.record.status = status
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        if cycle.access_log:
            cycle.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(cycle.scope), cycle.scope["method"],
                                     get_path_with_query_string(cycle.scope), cycle.scope["http_version"], status)
        lines = [b"%b: %b\r\n" % (name.lower(), value) for name, value in pairs]
        keep_alive = cycle.keep_alive
        head = b"".join((STATUS_LINE[status], *lines, b"" if keep_alive else b"connection: close\r\n",
                         b"transfer-encoding: chunked\r\n\r\n%x\r\n" % len(body)))
        cycle.chunked_encoding = True
        self._hold = None
        if self._observation is not None:
            self._observation.body(body)
        cycle.transport.write(b"".join((head, body, b"\r\n" if more else b"\r\n0\r\n\r\n")))
        if not more:
            cycle.response_complete = True
            cycle.message_event.set()
            if not keep_alive:
                cycle.transport.close()
            cycle.on_response()
        return True

    def _decline(self) -> bool:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold(self._cycle)
        return False

    def ready(self) -> bool:
        cycle = self._cycle
        return (cycle.response_started and not cycle.response_complete and cycle.chunked_encoding is True
                and cycle.scope["method"] != "HEAD")

    def write(self, body: bytes, more: bool) -> bool:
        """uvicorn's ``send`` of a body message after ``Observe``'s look at it, without the wait for a paused
        transport before the write: the caller stops writing when this returns False and :meth:`drain`\\ s."""
        if self._observation is not None:
            self._observation.body(body)
        cycle = self._cycle
        if cycle.disconnected:
            return True
        if cycle.response_complete:
            raise RuntimeError("Unexpected ASGI message 'http.response.body' sent, after response already completed.")
        if more:
            if body:
                (self._out or self._transport()).write(b"%x\r\n%b\r\n" % (len(body), body))
            return not cycle.flow.write_paused
        if body:
            cycle.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
        else:
            cycle.transport.write(b"0\r\n\r\n")
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()
        return not cycle.flow.write_paused

    def _transport(self) -> Any:
        """The cycle's transport, or its :class:`HeadHold`'s inner one once the hold holds nothing (a
        stream's first chunk took the head with it; nothing is held after that): a chunk's write skips the
        hold's Python frame. Kept from then on (the cycle's transport is only changed back after the response)."""
        transport: Any = self._cycle.transport
        if isinstance(transport, HeadHold):
            if not transport.idle():
                return transport  # the head waits for this chunk: through the hold, and asked again next time
            transport = transport.inner()
        self._out = transport
        return transport

    async def drain(self) -> None:
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()

    def splice(self, tally: StreamTally, last: float, finish: Callable[[bytes], bool],
               buckets: Buckets | None = None) -> Spliced | None:
        """A C sink doing, per chunk, the relay's sink and :meth:`write` (``more`` True) in one call: the gap, the
        tally, the observation's look, the chunked write to the transport (the hold's inner one), the back-pressure
        answer; the gaps counted by ``buckets``' bounds (None: kept one by one). None without the extension or
        while a head is held (the relay's Python sink then)."""
        if _native is None:
            return None
        transport = self._out or self._transport()
        if isinstance(transport, HeadHold):
            return None
        cycle = self._cycle
        observation = self._observation
        seam, usage, open_, _ = tally.state()
        sink: Spliced = _native.ChunkSink(transport.write, cycle, cycle.flow, finish,
                                          None if observation is None else observation.body, seam, usage, open_,
                                          last, None if buckets is None else buckets.bounds)
        return sink

    def settle(self, spliced: Spliced, tally: StreamTally, observe_gap: Callable[[float], None],
               buckets: Buckets | None = None) -> None:
        tally.restore(*spliced.tally())
        if buckets is not None:
            counts, total = spliced.buckets()
            if any(counts):
                buckets.add(counts, total)
        for gap in spliced.gaps():
            observe_gap(gap)
        if self._observation is not None:
            self._observation.events += spliced.events()
