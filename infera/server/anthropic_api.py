"""Anthropic endpoints: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Thin handlers over the OpenAI path's machinery: the request is validated and translated to
an OpenAI chat body (``infera.protocols.anthropic*``), routed by the same ``Router.dispatch``
(same failover, cancellation and load accounting), and the engine's answer is translated
back. ``anthropic-version`` and ``x-api-key`` are accepted; the key is never forwarded.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from infera.protocols.anthropic import (
    CountTokensRequest,
    MessagesRequest,
    TranslationError,
    ValidationError,
    describe_error,
    error_body,
)
from infera.protocols.anthropic_convert import from_openai, openai_messages, openai_tools, strip_system, to_openai
from infera.protocols.anthropic_stream import PING, SseDecoder, StreamError, StreamTranslator, encode, error_event
from infera.router.router import RoutedResponse, Router, RouteRequest, RoutingError
from infera.server.metrics import ServerMetrics
from infera.server.relay import (
    WORKER_HEADER,
    BodyTooLarge,
    cancel,
    collect_or_disconnect,
    dispatch_or_disconnect,
    forward_headers,
    read_body,
    wait_disconnect,
)
from infera.server.responses import JsonResponse
from infera.transport.base import UpstreamError

log = logging.getLogger(__name__)

PATH = "/v1/messages"
ENGINE_PATH = "/v1/chat/completions"
KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error",
         529: "overloaded_error"}

Req = TypeVar("Req", bound=CountTokensRequest)


def anthropic_status(status: int) -> tuple[int, str]:
    """The status and error type Anthropic uses for a failure we saw as ``status``."""
    if status == 503:
        return 529, "overloaded_error"  # no worker can take it: Anthropic's "overloaded"
    if status in KINDS:
        return status, KINDS[status]
    return (400, "invalid_request_error") if 400 <= status < 500 else (500, "api_error")


def anthropic_error(status: int, message: str) -> JsonResponse:
    status, kind = anthropic_status(status)
    return JsonResponse(error_body(kind, message), status_code=status)


def _engine_message(body: bytes) -> str:
    """The message of an engine's error body (OpenAI or vLLM shape), else its text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode("utf-8", "replace")
    err = data.get("error", data) if isinstance(data, dict) else data
    message = err.get("message") if isinstance(err, dict) else None
    return str(message) if message else body[:300].decode("utf-8", "replace")


class AnthropicHandlers:
    """``ping_after``: seconds without a first token before the stream starts with pings;
    ``ping_interval``: seconds between pings while the first token is still awaited."""

    def __init__(self, router: Router, metrics: ServerMetrics, max_body_bytes: int, strip_patterns: Sequence[str],
                 *, ping_after: float = 1.0, ping_interval: float = 5.0) -> None:
        self.router = router
        self.metrics = metrics
        self.max_body = max_body_bytes
        self.patterns = [re.compile(p) for p in strip_patterns if p]
        self.ping_after = ping_after
        self.ping_interval = ping_interval

    def routes(self) -> APIRouter:
        api = APIRouter()
        api.add_api_route(PATH, self.messages, methods=["POST"])
        api.add_api_route(PATH + "/count_tokens", self.count_tokens, methods=["POST"])
        return api

    # ---- requests ------------------------------------------------------------------------

    async def _parse(self, request: Request, schema: type[Req]) -> Req | Response:
        try:
            body = await read_body(request, self.max_body)
        except BodyTooLarge:
            return anthropic_error(413, f"request body exceeds {self.max_body} bytes")
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return anthropic_error(400, f"malformed JSON body: {exc}")
        if not isinstance(payload, dict):
            return anthropic_error(400, "the request body must be a JSON object")
        try:
            parsed = schema.model_validate(payload)
        except ValidationError as exc:
            return anthropic_error(400, describe_error(exc, payload))
        if parsed.model not in self.router.models():
            if not self.router.fleet.workers():
                return anthropic_error(503, "no workers are available")
            return anthropic_error(404, f"model: {parsed.model} (served here: {', '.join(self.router.models())})")
        strip_system(parsed, self.patterns)
        return parsed

    async def count_tokens(self, request: Request) -> Response:
        parsed = await self._parse(request, CountTokensRequest)
        if isinstance(parsed, Response):
            return parsed
        renderer = self.router.renderer
        if renderer is None:
            return anthropic_error(500, "count_tokens needs the router's tokenizer (--router-tokenizer-path)")
        final_assistant = parsed.messages[-1].role == "assistant"
        try:
            ids = renderer.chat_token_ids(openai_messages(parsed), tools=openai_tools(parsed),
                                          add_generation_prompt=not final_assistant)
        except Exception as exc:  # the chat template refused the conversation
            return anthropic_error(400, f"cannot render the prompt: {exc}")
        return JsonResponse({"input_tokens": len(ids)})

    async def messages(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await self._messages(request, started)
        except Exception as exc:
            log.exception("anthropic request failed")
            response = anthropic_error(500, f"internal error: {type(exc).__name__}")
        if not isinstance(response, StreamingResponse):
            self.metrics.requests.labels(PATH, str(response.status_code)).inc()
            self.metrics.e2e.labels(PATH).observe(time.perf_counter() - started)
        return response

    async def _messages(self, request: Request, started: float) -> Response:
        parsed = await self._parse(request, MessagesRequest)
        if isinstance(parsed, Response):
            return parsed
        body = to_openai(parsed)
        req = RouteRequest(kind="chat", path=ENGINE_PATH, body=orjson.dumps(body), payload=body, model=parsed.model,
                           max_tokens=parsed.max_tokens, worker_hint=request.headers.get(WORKER_HEADER))
        message_id = "msg_" + uuid.uuid4().hex[:24]
        headers = forward_headers(request)
        if parsed.stream:
            translator = StreamTranslator(message_id, parsed.model, parsed.stop_sequences)
            return await self._stream(request, req, headers, translator, started)
        routed = await dispatch_or_disconnect(self.router, request, req, headers)
        if routed is None:
            return Response(status_code=499)
        if isinstance(routed, RoutingError):
            return anthropic_error(routed.status, str(routed))
        self.metrics.ttft.labels(PATH).observe(time.perf_counter() - started)
        try:
            collected = await collect_or_disconnect(request, routed)
        except UpstreamError as exc:
            return anthropic_error(exc.status, f"the worker failed before the response was complete: {exc}")
        if collected is None:
            return Response(status_code=499)
        if routed.status != 200:
            return anthropic_error(routed.status, _engine_message(collected))
        try:
            message = from_openai(orjson.loads(collected), message_id=message_id, model=parsed.model,
                                  stop_sequences=parsed.stop_sequences)
        except (orjson.JSONDecodeError, TranslationError) as exc:
            return anthropic_error(502, f"the worker's response cannot be translated: {exc}")
        return JsonResponse(message, headers={"x-infera-worker": routed.worker_id})

    # ---- streaming -----------------------------------------------------------------------

    async def _stream(self, request: Request, req: RouteRequest, headers: dict[str, str],
                      translator: StreamTranslator, started: float) -> Response:
        """Answer with an HTTP error if routing fails quickly; once the first token is late, commit
        to the stream (message_start, pings) and report any failure as an ``error`` event."""
        dispatch = asyncio.ensure_future(self.router.dispatch(req, headers))
        watcher = asyncio.ensure_future(wait_disconnect(request))
        try:
            done, _ = await asyncio.wait((dispatch, watcher), timeout=self.ping_after,
                                        return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await cancel(dispatch)
            raise
        finally:
            watcher.cancel()
        if watcher in done and not dispatch.done():
            await cancel(dispatch)
            return Response(status_code=499)
        if not dispatch.done():
            return StreamingResponse(self._events(translator, dispatch, started), media_type="text/event-stream")
        try:
            routed = dispatch.result()
        except RoutingError as exc:
            return anthropic_error(exc.status, str(exc))
        if routed.status != 200 or not routed.content_type.startswith("text/event-stream"):
            try:
                collected = await collect_or_disconnect(request, routed)
            except UpstreamError as exc:
                return anthropic_error(exc.status, f"the worker failed: {exc}")
            status = routed.status if routed.status != 200 else 502
            return anthropic_error(status, _engine_message(collected or b"the worker did not stream"))
        return StreamingResponse(self._events(translator, dispatch, started), media_type="text/event-stream",
                                 headers={"x-infera-worker": routed.worker_id})

    async def _events(self, translator: StreamTranslator, dispatch: asyncio.Future[RoutedResponse],
                      started: float) -> AsyncIterator[bytes]:
        status = "200"
        routed: RoutedResponse | None = None
        try:
            yield b"".join(encode(e) for e in translator.start()) + encode(PING)
            while not dispatch.done():
                await asyncio.wait((dispatch,), timeout=self.ping_interval)
                if not dispatch.done():
                    yield encode(PING)
            routed = await self._routed(dispatch)
            self.metrics.ttft.labels(PATH).observe(time.perf_counter() - started)
            itl = self.metrics.itl.labels(PATH)
            decoder = SseDecoder()
            last = time.perf_counter()
            async for chunk in routed.chunks():
                now = time.perf_counter()
                itl.observe(now - last)
                last = now
                out = b"".join(encode(e) for data in decoder.feed(chunk) for e in translator.feed(data))
                if out:
                    yield out
            yield b"".join(encode(e) for e in translator.finish())
        except StreamError as exc:
            status = "stream_error"
            yield encode(error_event(exc.kind, str(exc)))
        except UpstreamError as exc:
            status = "stream_error"
            yield encode(error_event("api_error", f"the worker failed mid-stream: {exc}"))
        except asyncio.CancelledError:
            status = "499"
            raise
        finally:
            if routed is not None:
                routed.close()
            await cancel(dispatch)
            self.metrics.requests.labels(PATH, status).inc()
            self.metrics.e2e.labels(PATH).observe(time.perf_counter() - started)

    async def _routed(self, dispatch: asyncio.Future[RoutedResponse]) -> RoutedResponse:
        """The dispatched response, or :class:`StreamError` for what must become an error event."""
        try:
            routed = dispatch.result()
        except RoutingError as exc:
            raise StreamError(str(exc), anthropic_status(exc.status)[1]) from exc
        if routed.status == 200 and routed.content_type.startswith("text/event-stream"):
            return routed
        try:
            body = b"".join([chunk async for chunk in routed.chunks()])
        except UpstreamError as exc:
            raise StreamError(f"the worker failed: {exc}") from exc
        raise StreamError(_engine_message(body), anthropic_status(routed.status)[1] if routed.status != 200
                          else "api_error")
