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

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from infera.kv.native import load
from infera.server.coalesce import HeadHold
from infera.server.metrics import Buckets
from infera.server.observe import Observation
from infera.server.relay import Spliced
from infera.server.tally import StreamTally

_native = load()  # ChunkSink (csrc/splice.c), or None: the relay's Python sink


class CycleWriter:
    """:class:`~infera.server.relay.BodyWriter` over one uvicorn request cycle (chunked bodies only)."""

    __slots__ = ("_cycle", "_observation", "_out")

    def __init__(self, cycle: RequestResponseCycle, observation: Observation | None) -> None:
        self._cycle = cycle
        self._observation = observation
        self._out: Any = None  # the transport a chunk is written to, once known (see _transport)

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
