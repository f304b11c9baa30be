"""Seams of the transport layer: how a request reaches a worker, how KV events reach the router."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from infera.protocols.kv_events import EventBatch
from infera.protocols.worker import WorkerRecord


class UpstreamError(Exception):
    """A worker could not serve a request.

    ``before_first_byte`` is True when nothing of the response has reached the client
    yet, so the router may retry on another worker. ``status`` is the status code the
    client should see if the error surfaces (502 unreachable/broken, 504 timed out).
    """

    def __init__(self, message: str, *, status: int = 502, before_first_byte: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.before_first_byte = before_first_byte


def nothing_buffered() -> bytes:
    return b""


def not_known_ended() -> bool:
    return False


@dataclasses.dataclass
class UpstreamResponse:
    """A worker's answer whose status and headers have arrived; the body may still stream.

    ``body`` yields raw bytes as the worker sends them. ``close()`` must be called (it is
    idempotent) and aborts the upstream request if the body was not read to the end.
    ``drain()`` returns, without waiting, body bytes already received but not yet yielded
    (b"" when none, or when the transport cannot tell), so a relay can send them with the
    chunk in hand; call it only between reads of ``body``. ``ended()`` is True when every byte of the
    body has been yielded or drained already (the next read of ``body`` would end it): a whole answer
    is then complete without another read (False when the transport cannot tell). ``pipe``, where the
    transport has one (None elsewhere), replaces reading ``body`` after its first chunk: ``await
    pipe(sink)`` hands each arriving piece to ``sink`` in the transport's own callback (no task step per
    chunk) and returns True at the body's end, False when ``sink`` returned False (back-pressure: nothing is
    read until the next call); failures are raised as by ``body``.
    """

    status: int
    content_type: str
    body: AsyncIterator[bytes]
    close: Callable[[], None]
    drain: Callable[[], bytes] = nothing_buffered
    ended: Callable[[], bool] = not_known_ended
    pipe: Callable[[Callable[[bytes], bool]], Awaitable[bool]] | None = None


class RequestTransport(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self, worker: WorkerRecord, path: str, body: bytes, headers: Mapping[str, str],
        started: float | None = None,
    ) -> UpstreamResponse:
        """POST ``body`` to ``path`` (e.g. ``/v1/chat/completions``) on ``worker``.

        Returns once the response status is known. Raises :class:`UpstreamError` when the
        worker is unreachable, answers 5xx, or sends no first byte in time; the transport owns
        that deadline (its first body chunk included), the caller adds none of its own.
        ``started`` is the ``time.monotonic()`` at which the client's request began: a cap on
        the whole request counts from it, across every retry of that request (None = now).
        """
        ...


EventSink = Callable[[str, EventBatch], None]
"""Called with (worker id, batch) for every batch, in sequence order per worker."""

GapSink = Callable[[str, int], None]
"""Called with (worker id, number of batches lost) when a gap could not be repaired."""

RawSink = Callable[[str, bytes], bool]
"""Tried first with (worker id, the batch's msgpack payload): True when it took the batch whole; False when it
changed nothing and the batch goes on to be decoded for the :data:`EventSink`."""


SocketSink = Callable[[str, int, int | None], tuple[int, int | None, Any] | None]
"""Tried first by a ZMQ source each time a socket signals, with (worker id, the libzmq SUB socket's address
(``zmq.Socket.underlying``), the next expected seq, None: any): takes every queued ``[topic, seq, payload]`` batch in
sequence off the socket and applies it, as the source's own loop would through the :data:`RawSink`, until the socket
says nothing is queued or a message it leaves to the source. Returns (one of the ``DRAIN_*`` codes, the next expected
seq, what goes with the code), or None: it read nothing (the source reads the socket itself)."""

StreamSink = Callable[[str, int, bytearray, int | None], tuple[int, int | None, Any] | None]
"""The :data:`SocketSink` for a ZMTP stream read without libzmq (:mod:`infera.transport.zmtp`): with (worker id, the TCP
socket's descriptor, the bytes read off it and not yet parsed (kept there: a message's start at its head), the next
expected seq); the same answers, and :data:`DRAIN_COMMAND`."""



class StreamState:
    """A ZMTP link's state a :data:`ReadySink` reads and sets: the worker it follows, the bytes read off the socket
    and not yet parsed (the link's ``buffer``), the next expected seq (None: any) and whether the source's task owns
    the link (``busy``: a replay, a reconnection; the source's reader takes the signal then)."""

    __slots__ = ("buffer", "busy", "expected", "worker_id")

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.buffer = bytearray()
        self.expected: int | None = None
        self.busy = True


ReadySink = Callable[[int, dict[int, StreamState]], tuple[list[int], list[tuple[StreamState, int, Any]]]]
"""A decision's catch-up in one call, tried by a ZMQ source that has ZMTP links: with (the source's epoll descriptor,
descriptor -> :class:`StreamState` of its ZMTP links): ``epoll_wait(0)`` on it and, for each ready descriptor of
``streams`` that is not busy, the :data:`StreamSink`'s drain, its ``expected`` set. Returns (the ready descriptors
it did not drain: the source runs their readers; (state, ``DRAIN_*`` code, what goes with it) for each drain that
ended other than :data:`DRAIN_EMPTY`: the link's reader goes on from there)."""

DRAIN_EMPTY = 0
"""Nothing more is queued; with None."""
DRAIN_MESSAGE = 1
"""With a message's three frames (taken off the socket, nothing done with them): the source takes it as its own."""
DRAIN_FAILED = 2
"""With (seq, exception): a batch in sequence whose apply failed (a lost batch, as for a raising RawSink)."""
DRAIN_FRAMES = 3
"""With the frame count of a message that did not have 3 (taken off the socket, to be ignored)."""
DRAIN_DECLINED = 4
"""Nothing read: the source reads the socket itself."""
DRAIN_BROKEN = 5
"""With the socket's error (an exception to raise)."""
DRAIN_COMMAND = 6
"""A ZMTP stream's command is next (:data:`StreamSink`): nothing taken of it, the source reads it."""


class KvEventSource(Protocol):
    def bind(self, sink: EventSink, on_gap: GapSink, raw: RawSink | None = None,
             socket: SocketSink | None = None, stream: StreamSink | None = None,
             ready: ReadySink | None = None) -> None:
        """Set where batches and unrepairable gaps go; called once, before ``start``. ``raw``, if given, is
        offered each batch's payload before it is decoded (:func:`infera.transport.delivery.deliver`); ``socket``,
        if given, a ZMQ socket's queued batches, ``stream`` a ZMTP stream's and ``ready`` every ready ZMTP stream's
        at a catch-up (a source of another kind ignores them)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def watch(self, worker: WorkerRecord) -> None:
        """Start receiving ``worker``'s events (no-op if it publishes none or is watched already)."""
        ...

    def unwatch(self, worker_id: str) -> None: ...

    def catch_up(self) -> None:
        """A routing decision starts (on the loop): apply now every batch that has reached this source and waits
        to be applied, so that the decision sees it (a no-op for a source that applies each as it arrives)."""
        ...
