"""Starlette plumbing shared by the endpoint modules: JSON in and out with orjson, SSE framing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from infera.engine.mock.service import ApiError

DONE = b"data: [DONE]\n\n"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def error_response(err: ApiError) -> Response:
    return json_response(err.body(), err.status)


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class SseResponse(Response):
    """Server-sent events from an async iterator of ready-framed bytes.

    Leaner than Starlette's StreamingResponse (no task group per response): one plain task
    waits for the client's disconnect and calls ``on_disconnect`` (which aborts the request,
    ending the iterator). Each chunk is one write.
    """

    def __init__(self, chunks: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        self._chunks = chunks
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        watcher.add_done_callback(lambda t: None if t.cancelled() else self._on_disconnect())
        try:
            async for chunk in self._chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()


async def finished_or_disconnected(done: asyncio.Future[None], receive: Receive,
                                   abort: Callable[[], None]) -> bool:
    """Wait for a non-streamed request to finish; True if it did, False if the client left first.

    Engines abort a request whose client has gone (vLLM does, via ``is_disconnected``), so
    no step time is spent on output nobody will read.
    """
    if done.done():
        return True
    watcher = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait((done, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if done.done():
        return True
    abort()
    return False


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def bool_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be a boolean", param=name)
    return value
