"""NATS request transport: publish each request to ``infera.req.<worker>``, stream the reply frames back.

Framing is :mod:`infera.protocols.nats_wire`. One wildcard inbox subscription serves every
request of this frontend (each request gets its own reply subject under it), so a request
costs one publish and no subscribe/unsubscribe round trip.

Controls: ``idle_timeout`` seconds for each next frame, the first token's included (0 =
forever: the router adds no first-byte deadline of its own); ``max_duration`` seconds for the
whole client request, counted from its ``started`` time so that a retry does not restart it
(0 = off); both end it with 504 and a cancel to ``infera.cancel.<worker>``. ``max_pending``
requests in flight per worker from this frontend (0 = off), above which :meth:`send` raises
429 before anything is sent (the router then tries another worker). Closing a response that
has not ended also publishes the cancel, and so does a send cancelled while it waits for the
head frame (a client that left a non-streamed request: its head comes only with the whole
answer). When the broker connection drops, every request in flight ends at once with 502
(nats-py reconnects by itself; new requests are refused with 502 until it has).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from infera.protocols import nats_wire as wire
from infera.protocols.worker import WorkerRecord
from infera.transport.base import UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

NO_RESPONDERS = "503"  # status of the message the broker sends to the reply subject when nobody listens
RECONNECT_WAIT = 0.5  # seconds between reconnect attempts
_HOP_HEADERS = frozenset({"content-length", "host", "connection", "transfer-encoding", "keep-alive"})


class _Call:
    """One request in flight: its reply frames, its deadline, and whether it has ended."""

    __slots__ = ("cancel_subject", "deadline", "ended", "frames", "held", "reply", "started", "worker_id")

    def __init__(self, worker_id: str, cancel_subject: str, reply: str, deadline: float | None) -> None:
        self.worker_id = worker_id
        self.cancel_subject = cancel_subject
        self.reply = reply
        self.frames: asyncio.Queue[Msg | UpstreamError] = asyncio.Queue()
        self.deadline = deadline
        self.ended = False
        self.started = False  # a body chunk has been handed out
        self.held: Msg | UpstreamError | None = None  # taken from the queue by a drain, not yet read


class NatsRequestTransport:
    def __init__(self, url: str, idle_timeout: float = 900.0, max_duration: float = 0.0, max_pending: int = 0,
                 connect_timeout: float = 5.0) -> None:
        self._url = url
        self._idle = idle_timeout
        self._max_duration = max_duration
        self._max_pending = max_pending
        self._connect_timeout = connect_timeout
        self._nc: Client | None = None
        self._prefix = ""
        self._ids = itertools.count()
        self._calls: dict[str, _Call] = {}
        self._pending: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self._nc = await nats.connect(
                self._url, name="infera-frontend", connect_timeout=self._connect_timeout, allow_reconnect=True,
                max_reconnect_attempts=-1, reconnect_time_wait=RECONNECT_WAIT,
                disconnected_cb=self._on_disconnected, reconnected_cb=self._on_reconnected,
                error_cb=self._on_error)
        except (OSError, NatsError) as exc:
            raise OSError(f"cannot reach the NATS broker at {self._url}: {exc}") from exc
        self._prefix = self._nc.new_inbox()
        await self._nc.subscribe(self._prefix + ".*", cb=self._on_reply)

    async def stop(self) -> None:
        for call in list(self._calls.values()):
            self._fail(call, UpstreamError("the frontend is stopping"))
        if self._nc is not None:
            with contextlib.suppress(NatsError, OSError):
                await self._nc.drain()
            self._nc = None

    async def _on_disconnected(self) -> None:
        if self._calls:
            log.warning("NATS connection lost; ending %d requests in flight with 502", len(self._calls))
        for call in list(self._calls.values()):
            self._fail(call, UpstreamError(f"worker {call.worker_id}: the NATS connection was lost", status=502))

    async def _on_reconnected(self) -> None:
        log.info("NATS connection to %s restored", self._url)

    async def _on_error(self, exc: Exception) -> None:
        log.debug("NATS: %s", exc)

    def _fail(self, call: _Call, error: UpstreamError) -> None:
        call.frames.put_nowait(error)
        self._end(call)

    def _end(self, call: _Call) -> None:
        if call.ended:
            return
        call.ended = True
        self._calls.pop(call.reply, None)
        left = self._pending.get(call.worker_id, 1) - 1
        if left > 0:
            self._pending[call.worker_id] = left
        else:
            self._pending.pop(call.worker_id, None)

    async def _on_reply(self, msg: Msg) -> None:
        call = self._calls.get(msg.subject)
        if call is not None:
            call.frames.put_nowait(msg)

    def pending(self, worker_id: str) -> int:
        """Requests this frontend has in flight on ``worker_id``."""
        return self._pending.get(worker_id, 0)

    # ---- requests ----------------------------------------------------------------------------

    async def send(
        self, worker: WorkerRecord, path: str, body: bytes, headers: Mapping[str, str],
        started: float | None = None,
    ) -> UpstreamResponse:
        wid = worker.instance_id
        nc = self._nc
        if nc is None:
            raise UpstreamError("the NATS transport is not started")
        if not worker.nats_subject:
            raise UpstreamError(f"worker {wid} has no NATS subject (it serves over HTTP only)")
        if self._max_pending and self._pending.get(wid, 0) >= self._max_pending:
            raise UpstreamError(f"worker {wid} has {self._max_pending} requests pending (--nats-req-max-pending)",
                                status=429)
        if not nc.is_connected:
            raise UpstreamError(f"worker {wid}: not connected to the NATS broker {self._url}")
        reply = f"{self._prefix}.{next(self._ids):x}"
        begun = time.monotonic() if started is None else started
        deadline = begun + self._max_duration if self._max_duration > 0 else None
        call = _Call(wid, wire.cancel_subject(worker.nats_subject), reply, deadline)
        self._calls[reply] = call
        self._pending[wid] = self._pending.get(wid, 0) + 1
        nats_headers = {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
        nats_headers[wire.PATH_HEADER] = path
        try:
            await nc.publish(worker.nats_subject, body, reply=reply, headers=nats_headers)
            frame = await self._next(call)
            if frame[:1] != wire.HEAD:
                raise UpstreamError(f"worker {wid} sent no response head over NATS")
            status, content_type = wire.decode_head(frame)
            if status >= 500:
                text = b"".join([chunk async for chunk in self._frames(call)])[:300].decode("utf-8", "replace")
                raise UpstreamError(f"worker {wid} answered {status}: {text}")
        except UpstreamError:
            self._close(call)
            raise
        except (NatsError, OSError, ValueError) as exc:
            self._close(call)
            raise UpstreamError(f"worker {wid}: NATS request failed: {exc}") from exc
        except BaseException:  # the client left (CancelledError): the worker must stop, the slot free up
            self._close(call)
            raise
        return UpstreamResponse(status=status, content_type=content_type, body=self._frames(call),
                                close=lambda: self._close(call), drain=lambda: self._drain(call))

    async def _next(self, call: _Call) -> bytes:
        """The next frame's bytes; raises UpstreamError on a failure, a FAIL frame or a timeout."""
        timeout = self._idle if self._idle > 0 else math.inf
        limit = "idle timeout"
        if call.deadline is not None and call.deadline - time.monotonic() < timeout:
            timeout, limit = max(0.0, call.deadline - time.monotonic()), "max duration"
        try:
            if call.held is not None:
                item, call.held = call.held, None
            else:
                async with asyncio.timeout(None if math.isinf(timeout) else timeout):
                    item = await call.frames.get()
        except TimeoutError:
            self._close(call)
            seconds = self._idle if limit == "idle timeout" else self._max_duration
            raise UpstreamError(f"worker {call.worker_id}: NATS {limit} ({seconds:g}s) expired", status=504,
                                before_first_byte=not call.started) from None
        if isinstance(item, UpstreamError):
            item.before_first_byte = not call.started
            raise item
        if item.headers and item.headers.get("Status") == NO_RESPONDERS:
            self._end(call)
            raise UpstreamError(f"worker {call.worker_id}: no responder on NATS (its bridge is not subscribed)")
        data: bytes = item.data
        if data[:1] == wire.FAIL:
            self._end(call)
            raise UpstreamError(f"worker {call.worker_id}: {data[1:].decode('utf-8', 'replace')}",
                                before_first_byte=not call.started)
        return data

    def _drain(self, call: _Call) -> bytes:
        """The data of the DATA frames queued already, joined, without waiting; the first frame of
        any other kind (end, failure, error) is held for the next read, which handles it."""
        frames = call.frames
        if call.held is not None or frames.empty():
            return b""
        parts: list[bytes] = []
        while not frames.empty():
            item = frames.get_nowait()
            if isinstance(item, UpstreamError) or item.headers or item.data[:1] != wire.DATA:
                call.held = item
                break
            if len(item.data) > 1:
                parts.append(item.data[1:])
        if parts:
            call.started = True
        return b"".join(parts)

    async def _frames(self, call: _Call) -> AsyncIterator[bytes]:
        try:
            while True:
                frame = await self._next(call)
                tag = frame[:1]
                if tag == wire.END:
                    self._end(call)
                    return
                if tag == wire.DATA and len(frame) > 1:
                    call.started = True
                    yield frame[1:]
        finally:
            self._close(call)

    def _close(self, call: _Call) -> None:
        """End ``call``; if the worker may still be working on it, tell it to stop."""
        if call.ended:
            return
        self._end(call)
        nc = self._nc
        if nc is not None and nc.is_connected:
            task = asyncio.get_running_loop().create_task(self._cancel(nc, call))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _cancel(self, nc: Client, call: _Call) -> None:
        with contextlib.suppress(NatsError, OSError):
            await nc.publish(call.cancel_subject, call.reply.encode())
            await nc.flush(timeout=1)
