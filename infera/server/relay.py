"""What every inference endpoint shares, whatever API it speaks: one watch on the client per
request, routing that gives up when the client leaves, collecting a whole response, and the
SSE relay that passes a worker's stream through untouched.

Errors stay protocol neutral here (:class:`RoutingError`, :class:`UpstreamError`); each API
module renders them in its own shape.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from infera.router.errors import RoutingError
from infera.router.router import RoutedResponse, Router, RouteRequest
from infera.server.metrics import Buckets
from infera.server.responses import until_disconnect
from infera.server.tally import StreamTally, Usage
from infera.transport.base import UpstreamError

FORWARD_HEADERS = ("authorization", "x-request-id", "traceparent", "tracestate")
WORKER_HEADER = "x-worker-instance-id"
PREFILL_HEADER = "x-prefill-instance-id"
_FORWARD = {name.encode(): name for name in FORWARD_HEADERS}
_WORKER = WORKER_HEADER.encode()
_PREFILL = PREFILL_HEADER.encode()


def forward_headers(request: Request) -> dict[str, str]:
    """The headers sent on to the worker: JSON content type plus auth and tracing ones (the
    request's first of each; one pass over the raw headers, no header object)."""
    return read_headers(request)[0]


def read_headers(request: Request) -> tuple[dict[str, str], str | None, str | None]:
    """:func:`forward_headers`, and the request's first ``x-worker-instance-id`` and
    ``x-prefill-instance-id`` (None when absent), in one pass over the raw headers."""
    headers = {"content-type": "application/json"}
    worker = prefill = None
    for key, value in request.scope["headers"]:
        if key in _FORWARD:
            if (name := _FORWARD[key]) not in headers:
                headers[name] = value.decode("latin-1")
        elif key == _WORKER:
            if worker is None:
                worker = value.decode("latin-1")
        elif key == _PREFILL and prefill is None:
            prefill = value.decode("latin-1")
    return headers, worker, prefill


def worker_headers(routed: RoutedResponse) -> dict[str, str]:
    """The response headers naming the worker (and, for a pair, the prefill worker) that served it."""
    out = {"x-infera-worker": routed.worker_id}
    if routed.prefill_worker_id:
        out["x-infera-prefill-worker"] = routed.prefill_worker_id
    return out


def worker_raw_headers(routed: RoutedResponse) -> list[tuple[bytes, bytes]]:
    """:func:`worker_headers` as raw (name, value) bytes, for a whole answer and a relayed stream."""
    out = [(b"x-infera-worker", routed.worker_id.encode("latin-1"))]
    if routed.prefill_worker_id:
        out.append((b"x-infera-prefill-worker", routed.prefill_worker_id.encode("latin-1")))
    return out


class Disconnects:
    """A client's going away, told by the server's protocol instead of read from ``receive()``: the lean
    hot path (:mod:`infera.server.lean`) puts one in the request's scope under :data:`DISCONNECTS`, and
    a :class:`ClientWatch` then needs no task of its own. ``task`` is the request's task, the one its handler
    runs in (set by the protocol that starts it: asking ``asyncio.current_task()`` per request costs a
    ``getpid()`` on 3.11)."""

    __slots__ = ("action", "gone", "task")

    def __init__(self) -> None:
        self.gone = False
        self.action: Callable[[], None] | None = None
        self.task: asyncio.Task[None] | None = None

    def fire(self) -> None:
        self.gone = True
        action, self.action = self.action, None
        if action is not None:
            action()


DISCONNECTS = "infera.disconnects"


class ClientWatch:
    """One watch per request that waits for the client to go away, then calls what :meth:`then` set.

    The same watch serves the dispatch (cancel it) and then the response (close the upstream),
    so a request never runs more than one watcher. It is a task reading ``receive()`` until the
    disconnect, or, given the protocol's :class:`Disconnects`, a callback on it.
    """

    __slots__ = ("_disconnects", "_task", "_then", "left")

    def __init__(self, receive: Receive, disconnects: Disconnects | None = None) -> None:
        self.left = False
        self._then: Callable[[], None] | None = None
        self._disconnects = disconnects
        self._task: asyncio.Future[None] | None = None
        if disconnects is None:
            self._task = asyncio.ensure_future(until_disconnect(receive))
            self._task.add_done_callback(self._fire)
        elif disconnects.gone:
            self.left = True
        else:
            disconnects.action = self._left

    @classmethod
    def of(cls, request: Request) -> ClientWatch:
        """The watch for ``request``: on the protocol's :class:`Disconnects` where the scope has one."""
        return cls(request.receive, request.scope.get(DISCONNECTS))

    def _fire(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled():
            self._left()

    def _left(self) -> None:
        self.left = True
        then, self._then = self._then, None
        if then is not None:
            then()

    def task(self) -> asyncio.Task[Any] | None:
        """The request's task: the protocol's (:class:`Disconnects`), else the current one."""
        disconnects = self._disconnects
        if disconnects is not None and disconnects.task is not None:
            return disconnects.task
        return asyncio.current_task()

    def then(self, action: Callable[[], None] | None) -> None:
        """Run ``action`` when the client leaves (now, if it has left already); None = nothing."""
        self._then = action
        if self.left and action is not None:
            self._then = None
            action()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        elif self._disconnects is not None and self._disconnects.action == self._left:
            self._disconnects.action = None


async def dispatch_or_disconnect(router: Router, watch: ClientWatch, req: RouteRequest,
                                 headers: dict[str, str]) -> RoutedResponse | RoutingError | None:
    """Dispatch, but give up (and release the worker) if the client goes away meanwhile (None).

    The dispatch runs in the caller's task, which the watch cancels when the client leaves (and
    which takes that cancellation back, so the caller goes on to answer 499): a task of its own
    would cost a turn of the event loop to start and another to hand its result back, both on
    the request's critical path."""
    if watch.left:
        return None  # gone already: a cancellation asked for now would hit this task's next await instead
    task = watch.task()
    assert task is not None
    cancelling = task.cancelling()
    gave_up = False

    def give_up() -> None:
        nonlocal gave_up
        gave_up = True
        task.cancel()

    watch.then(give_up)
    try:
        return await router.dispatch(req, headers)
    except RoutingError as exc:
        return exc
    except asyncio.CancelledError:
        # ours (the client left; dispatch released what it held as it was cancelled), unless the task was
        # also cancelled from elsewhere (shutdown), which must go on
        if gave_up and task.uncancel() <= cancelling:
            return None
        raise
    finally:
        watch.then(None)


async def cancel(task: asyncio.Future[RoutedResponse]) -> None:
    """Cancel a dispatch and wait for it to release what it holds; a response already in is closed."""
    if task.done():
        if not task.cancelled() and task.exception() is None:
            task.result().close()
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass


async def collect_or_disconnect(watch: ClientWatch, routed: RoutedResponse) -> bytes | None:
    """The whole response body, or None (upstream closed) if the client goes away first.

    Raises :class:`UpstreamError` when the worker fails before the body is complete.
    """
    watch.then(routed.close)
    try:
        parts = [routed.first, routed.drain()]
        if not routed.ended():  # the usual small answer came whole with its head: no read left to await
            async for chunk in routed.rest:
                parts.append(chunk)
    except UpstreamError:
        if watch.left:
            return None
        raise
    finally:
        watch.then(None)
        routed.close()
    return None if watch.left else b"".join(parts)


@dataclasses.dataclass(slots=True)
class Outcome:
    """How a relayed response ended, for the endpoint's accounting.

    ``status``: the HTTP status as text; "499" when the client left, "stream_error" when the
    worker failed mid-stream, "incomplete" when a 200 stream ended without ``data: [DONE]``.
    ``started``: ``time.perf_counter()`` at arrival. ``usage``: the engine's last usage object.
    ``ttft``: seconds from arrival to the worker's first byte, when it is recorded with the outcome (a
    whole answer's, after the answer is written) rather than before the answer (a stream's).
    """

    path: str
    status: str
    started: float
    usage: Usage | None = None
    ttft: float | None = None


class BodyWriter(Protocol):
    """A response's body written straight to the client, past the ASGI ``send`` (the server's protocol sets
    one on a :class:`SseRelay` it serves: :mod:`infera.server.splice`); what ``send`` does to a body message,
    synchronously."""

    def start(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, more: bool) -> bool:
        """Write the response's start and its first body piece (``more`` False: the whole body) as the sends would,
        in one write; False when it does not (nothing written): then ``send`` them."""
        ...

    def ready(self) -> bool:
        """The response has started and its body can be written by :meth:`write` (else ``send`` it)."""
        ...

    def write(self, body: bytes, more: bool) -> bool:
        """Write one body piece (``more`` False: the last); False when the client cannot take more now."""
        ...

    async def drain(self) -> None:
        """Wait until the client can take more (or has left)."""
        ...

    def splice(self, tally: StreamTally, last: float, finish: Callable[[bytes], bool],
               buckets: Buckets | None) -> Spliced | None:
        """A sink doing the relay's whole per-chunk work in one call (csrc/splice.c), taking ``tally`` over from
        here and the gaps from ``last`` (``time.perf_counter()``), counted into ``buckets``' bounds (None: kept);
        ``finish`` gets the chunk that ends the stream (the sink writes nothing after it). None: the relay's own
        sink does it (no C extension, a held head)."""
        ...

    def settle(self, spliced: Spliced, tally: StreamTally, observe_gap: Callable[[float], None],
               buckets: Buckets | None) -> None:
        """Hand back what ``spliced`` took over: the tally's state, the gaps (added to ``buckets``, else to
        ``observe_gap`` one by one), the observation's count."""
        ...


class Spliced(Protocol):
    """:meth:`BodyWriter.splice`'s sink (``infera.kv._native.ChunkSink``)."""

    def take(self, chunk: bytes) -> bool:
        """One chunk: what the relay's sink does with it; False when the client cannot take more now."""
        ...

    def gaps(self) -> list[float]:
        ...

    def buckets(self) -> tuple[list[int], float]:
        ...

    def tally(self) -> tuple[bytes, bytes, bool, bool]:
        ...

    def events(self) -> int:
        ...


_NO_CACHE = (b"cache-control", b"no-cache")
_EVENT_STREAM = (b"content-type", b"text/event-stream; charset=utf-8")


class SseRelay(Response):
    """A worker's SSE stream relayed to the client as one coroutine, bytes untouched.

    Per chunk: one read from the upstream plus a drain of what else is buffered (joined into one
    send), a :class:`StreamTally` scan for the end marker and usage, an inter-chunk histogram
    sample, one send. The chunk that holds ``data: [DONE]`` is sent as the body's end (no separate
    empty send). A failure mid-stream becomes ``error_event`` and a clean close. ``complete`` gets
    the :class:`Outcome` at the end.

    Spliced, when the server set :attr:`direct` and the upstream can ``pipe``: after the first chunk, the
    same per-chunk work runs in the upstream connection's callback as each socket read arrives, the body
    written to the client's transport there (no future, no task step, no message per chunk; one C call per chunk
    where :meth:`BodyWriter.splice` gives a sink); the coroutine
    waits for the end, a failure or the client's back-pressure (the upstream is not read meanwhile).
    """

    direct: BodyWriter | None = None

    media_type = "text/event-stream"

    def __init__(self, routed: RoutedResponse, watch: ClientWatch, path: str, started: float,
                 headers: list[tuple[bytes, bytes]], error_event: Callable[[UpstreamError], bytes],
                 observe_gap: Callable[[float], None], complete: Callable[[Outcome], None],
                 gap_buckets: Buckets | None = None) -> None:
        self.status_code = routed.status
        self.background = None
        # what init_headers({"cache-control": "no-cache", **headers}) makes of raw, lower-case ``headers`` naming
        # neither (the worker's, :func:`worker_raw_headers`), without its per-header encoding and scans
        self.raw_headers = [_NO_CACHE, *headers, _EVENT_STREAM]
        self._routed = routed
        self._watch = watch
        self._path = path
        self._started = started
        self._error_event = error_event
        self._observe_gap = observe_gap
        self._gap_buckets = gap_buckets  # observe_gap's histogram, for a C sink's counts (Buckets)
        self._complete = complete

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        routed, watch, observe_gap = self._routed, self._watch, self._observe_gap
        tally = StreamTally()
        status = str(routed.status)
        ended = False
        watch.then(routed.close)
        direct = self.direct
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        try:
            if direct is None:
                await send(start)
            chunk = routed.first + routed.drain()
            if chunk:
                tally.feed(chunk)
                ended = tally.done
                if ended:
                    self._finishing()
            # the server's writer writes the start with the first chunk, in one write; else they are sent
            if direct is None or not direct.start(self.status_code, self.raw_headers, chunk, not ended):
                if direct is not None:
                    await send(start)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
            last = time.perf_counter()
            pipe = routed.pipe

            def take(chunk: bytes) -> bool:
                """One chunk's bookkeeping (the inter-chunk gap, the tally); True when it ends the response."""
                nonlocal last, ended
                now = time.perf_counter()
                observe_gap(now - last)
                last = now
                tally.feed(chunk)
                ended = tally.done
                if ended:
                    self._finishing()
                return ended

            if not ended and direct is not None and pipe is not None and direct.ready():
                def finish(chunk: bytes) -> bool:
                    nonlocal ended
                    ended = True
                    self._finishing()
                    return direct.write(chunk, False)

                spliced = direct.splice(tally, last, finish, self._gap_buckets)
                if spliced is not None:
                    try:
                        while not await pipe(spliced.take):
                            await direct.drain()
                    finally:
                        direct.settle(spliced, tally, observe_gap, self._gap_buckets)
                else:
                    def sink(chunk: bytes) -> bool:
                        if ended:
                            return True  # nothing follows [DONE]; the body is only read to its end
                        return direct.write(chunk, not take(chunk))

                    while not await pipe(sink):
                        await direct.drain()
            else:
                drain = routed.drain
                async for chunk in routed.rest:
                    if ended:
                        continue  # nothing follows [DONE]; the body is only read to its end
                    more = drain()  # chunks that came meanwhile go out in the same send
                    if more:
                        chunk += more
                    await send({"type": "http.response.body", "body": chunk, "more_body": not take(chunk)})
        except UpstreamError as exc:
            if not watch.left and not ended:  # after [DONE] the client has its whole answer already
                status = "stream_error"
                ended = True
                await send({"type": "http.response.body", "body": self._error_event(exc), "more_body": False})
        except asyncio.CancelledError:
            status = "499"
            raise
        finally:
            watch.stop()
            routed.close()
            if watch.left and not tally.done:
                status = "499"
            elif status == "200" and not tally.done:
                status = "incomplete"
            self._complete(Outcome(self._path, status, self._started, tally.usage()))
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _finishing(self) -> None:
        """The [DONE] chunk is about to end the response: stop watching the client first. Once a
        response is complete, ASGI's receive() reports a disconnect, which must not close the
        upstream (the rest is read to its end so the connection goes back to the pool) nor count
        the request as abandoned."""
        self._watch.then(None)
        self._watch.stop()
