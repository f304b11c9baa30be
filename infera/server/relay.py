"""What every inference endpoint shares, whatever API it speaks: routing that gives up when the
client leaves, and collecting a whole response the same way.

Errors stay protocol neutral here (:class:`RoutingError`, :class:`UpstreamError`); each API
module renders them in its own shape.
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from infera.router.errors import RoutingError
from infera.router.router import RoutedResponse, Router, RouteRequest
from infera.server.responses import until_disconnect
from infera.transport.base import UpstreamError

FORWARD_HEADERS = ("authorization", "x-request-id", "traceparent", "tracestate")
WORKER_HEADER = "x-worker-instance-id"
PREFILL_HEADER = "x-prefill-instance-id"


def forward_headers(request: Request) -> dict[str, str]:
    """The headers sent on to the worker: JSON content type plus auth and tracing ones."""
    headers = {"content-type": "application/json"}
    for name in FORWARD_HEADERS:
        value = request.headers.get(name)
        if value is not None:
            headers[name] = value
    return headers


def worker_headers(routed: RoutedResponse) -> dict[str, str]:
    """The response headers naming the worker (and, for a pair, the prefill worker) that served it."""
    out = {"x-infera-worker": routed.worker_id}
    if routed.prefill_worker_id:
        out["x-infera-prefill-worker"] = routed.prefill_worker_id
    return out


async def dispatch_or_disconnect(router: Router, request: Request, req: RouteRequest,
                                 headers: dict[str, str]) -> RoutedResponse | RoutingError | None:
    """Dispatch, but give up (and release the worker) if the client goes away meanwhile (None).

    One watcher task per request whose completion cancels the dispatch: no ``asyncio.wait``
    and no third task on the hot path.
    """
    dispatch = asyncio.ensure_future(router.dispatch(req, headers))
    watcher = asyncio.ensure_future(until_disconnect(request.receive))
    watcher.add_done_callback(lambda w: None if w.cancelled() else dispatch.cancel())
    try:
        return await dispatch
    except RoutingError as exc:
        return exc
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            return None  # the client left; dispatch released what it held as it was cancelled
        raise
    finally:
        watcher.cancel()


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


async def collect_or_disconnect(request: Request, routed: RoutedResponse) -> bytes | None:
    """The whole response body, or None (upstream closed) if the client goes away first.

    Raises :class:`UpstreamError` when the worker fails before the body is complete.
    """
    watcher = asyncio.ensure_future(until_disconnect(request.receive))
    watcher.add_done_callback(lambda w: None if w.cancelled() else routed.close())
    try:
        body = b"".join([chunk async for chunk in routed.chunks()])
    except UpstreamError:
        if watcher.done() and not watcher.cancelled():
            return None
        raise
    finally:
        watcher.cancel()
    return None if watcher.done() and not watcher.cancelled() else body
