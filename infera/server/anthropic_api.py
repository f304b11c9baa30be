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
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from infera.protocols.anthropic import (
    CountTokensRequest,
    MessagesRequest,
    TranslationError,
    ValidationError,
    describe_error,
)
from infera.protocols.anthropic_convert import from_openai, openai_messages, openai_tools, strip_system, to_openai
from infera.protocols.anthropic_stream import PING, SseDecoder, StreamError, StreamTranslator, encode, error_event
from infera.router.errors import RoutingError
from infera.router.router import RoutedResponse, Router, RouteRequest
from infera.server.errors import ANTHROPIC_PREFIX as PATH
from infera.server.errors import anthropic_error, anthropic_routing_error, anthropic_status, routing_status
from infera.server.hot_routes import Endpoint
from infera.server.intake import Intake, IntakeError, take
from infera.server.metrics import ServerMetrics
from infera.server.relay import (
    ClientWatch,
    cancel,
    collect_or_disconnect,
    dispatch_or_disconnect,
    read_headers,
    worker_headers,
)
from infera.server.responses import JsonResponse, SseResponse, until_disconnect
from infera.transport.base import UpstreamError

__all__ = ["PATH", "AnthropicHandlers", "anthropic_error", "anthropic_status"]

log = logging.getLogger(__name__)

ENGINE_PATH = "/v1/chat/completions"

Req = TypeVar("Req", bound=CountTokensRequest)


def describe(exc: ValidationError, payload: dict[str, Any]) -> tuple[str, str | None]:
    """An Anthropic schema violation as (message, no param)."""
    return describe_error(exc, payload), None


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

    def hot_routes(self) -> dict[str, Endpoint]:
        """The routes served past FastAPI's routing stack (:mod:`infera.server.hot_routes`)."""
        return {PATH: self.messages}

    # ---- requests ------------------------------------------------------------------------

    async def _parse(self, request: Request, schema: type[Req]) -> Req | Response:
        parsed = await self._take(request, schema)
        return parsed if isinstance(parsed, Response) else parsed.parsed

    async def _take(self, request: Request, schema: type[Req]) -> Intake[Req] | Response:
        try:
            intake = await take(request, self.max_body, schema, describe, self._strip)
        except IntakeError as exc:
            return anthropic_error(exc.status, str(exc))
        parsed = intake.parsed
        view = self.router.view
        if not view.serves(parsed.model):
            if not view.has_workers():
                return anthropic_error(503, "no workers are available")
            return anthropic_error(404, f"model: {parsed.model} (served here: {', '.join(view.models())})")
        return intake

    def _strip(self, payload: dict[str, Any], parsed: Any) -> bool:
        strip_system(parsed, self.patterns)
        return False  # the parsed request is what is translated and forwarded

    async def count_tokens(self, request: Request) -> Response:
        intake = await self._take(request, CountTokensRequest)
        if isinstance(intake, Response):
            return intake
        parsed = intake.parsed
        if not self.router.can_tokenize:
            return anthropic_error(500, "count_tokens needs the router's tokenizer (--router-tokenizer-path)")
        final_assistant = parsed.messages[-1].role == "assistant"
        prompt = {"messages": openai_messages(parsed), "tools": openai_tools(parsed),
                  "chat_template_kwargs": {"add_generation_prompt": not final_assistant}}
        try:
            ids = await self.router.tokens_off_loop("chat", prompt, len(intake.body))
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
        if not isinstance(response, SseResponse):
            self.metrics.accounts(PATH).record(str(response.status_code), started, None, None)
        return response

    async def _messages(self, request: Request, started: float) -> Response:
        parsed = await self._parse(request, MessagesRequest)
        if isinstance(parsed, Response):
            return parsed
        body = to_openai(parsed)
        headers, worker_hint, prefill_hint = read_headers(request)
        req = RouteRequest(kind="chat", path=ENGINE_PATH, body=orjson.dumps(body), payload=body, model=parsed.model,
                           max_tokens=parsed.max_tokens, worker_hint=worker_hint, prefill_hint=prefill_hint)
        message_id = "msg_" + uuid.uuid4().hex[:24]
        if parsed.stream:
            translator = StreamTranslator(message_id, parsed.model, parsed.stop_sequences)
            return await self._stream(request, req, headers, translator, started)
        watch = ClientWatch.of(request)
        try:
            routed = await dispatch_or_disconnect(self.router, watch, req, headers)
            if routed is None:
                return Response(status_code=499)
            if isinstance(routed, RoutingError):
                return anthropic_routing_error(routed)
            self.metrics.observer(self.metrics.ttft, PATH)(time.perf_counter() - started)
            try:
                collected = await collect_or_disconnect(watch, routed)
            except UpstreamError as exc:
                return anthropic_error(exc.status, f"the worker failed before the response was complete: {exc}")
        finally:
            watch.stop()
        if collected is None:
            return Response(status_code=499)
        if routed.status != 200:
            return anthropic_error(routed.status, _engine_message(collected))
        try:
            message = from_openai(orjson.loads(collected), message_id=message_id, model=parsed.model,
                                  stop_sequences=parsed.stop_sequences)
        except (orjson.JSONDecodeError, TranslationError) as exc:
            return anthropic_error(502, f"the worker's response cannot be translated: {exc}")
        return JsonResponse(message, headers=worker_headers(routed))

    # ---- streaming -----------------------------------------------------------------------

    async def _stream(self, request: Request, req: RouteRequest, headers: dict[str, str],
                      translator: StreamTranslator, started: float) -> Response:
        """Answer with an HTTP error if routing fails quickly; once the first token is late, commit
        to the stream (message_start, pings) and report any failure as an ``error`` event."""
        dispatch = asyncio.ensure_future(self.router.dispatch(req, headers))
        watcher = asyncio.ensure_future(until_disconnect(request.receive))
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
            return self._sse(translator, dispatch, started, {})
        try:
            routed = dispatch.result()
        except RoutingError as exc:
            return anthropic_routing_error(exc)
        if routed.status != 200 or not routed.content_type.startswith("text/event-stream"):
            watch = ClientWatch.of(request)
            try:
                collected = await collect_or_disconnect(watch, routed)
            except UpstreamError as exc:
                return anthropic_error(exc.status, f"the worker failed: {exc}")
            finally:
                watch.stop()
            status = routed.status if routed.status != 200 else 502
            return anthropic_error(status, _engine_message(collected or b"the worker did not stream"))
        return self._sse(translator, dispatch, started, worker_headers(routed))

    def _sse(self, translator: StreamTranslator, dispatch: asyncio.Future[RoutedResponse], started: float,
             headers: dict[str, str]) -> SseResponse:
        gone: list[bool] = []

        def client_left() -> None:
            gone.append(True)
            if not dispatch.done():
                dispatch.cancel()
            elif not dispatch.cancelled() and dispatch.exception() is None:
                dispatch.result().close()

        return SseResponse(self._events(translator, dispatch, started, gone), headers=headers,
                           on_disconnect=client_left)

    async def _events(self, translator: StreamTranslator, dispatch: asyncio.Future[RoutedResponse],
                      started: float, gone: list[bool]) -> AsyncIterator[bytes]:
        """``gone`` becomes non-empty when the client disconnected (the dispatch or upstream is then ended)."""
        status = "200"
        routed: RoutedResponse | None = None
        try:
            yield b"".join(encode(e) for e in translator.start()) + encode(PING)
            while not dispatch.done():
                await asyncio.wait((dispatch,), timeout=self.ping_interval)
                if not dispatch.done():
                    yield encode(PING)
            routed = await self._routed(dispatch)
            self.metrics.observer(self.metrics.ttft, PATH)(time.perf_counter() - started)
            itl = self.metrics.observer(self.metrics.itl, PATH)
            decoder = SseDecoder()
            last = time.perf_counter()
            async for chunk in routed.chunks():
                now = time.perf_counter()
                itl(now - last)
                last = now
                out = b"".join(encode(e) for data in decoder.feed(chunk) for e in translator.feed(data))
                if out:
                    yield out
            if not gone:
                yield b"".join(encode(e) for e in translator.finish())
        except StreamError as exc:
            status = "stream_error"
            yield encode(error_event(exc.kind, str(exc)))
        except UpstreamError as exc:
            if gone:
                return
            status = "stream_error"
            yield encode(error_event("api_error", f"the worker failed mid-stream: {exc}"))
        except asyncio.CancelledError:
            status = "499"
            if gone and dispatch.cancelled():
                return  # the client left while the request waited for a worker
            raise
        finally:
            if routed is not None:
                routed.close()
            await cancel(dispatch)
            self.metrics.accounts(PATH).record("499" if gone else status, started, None, None)

    async def _routed(self, dispatch: asyncio.Future[RoutedResponse]) -> RoutedResponse:
        """The dispatched response, or :class:`StreamError` for what must become an error event."""
        try:
            routed = dispatch.result()
        except RoutingError as exc:
            raise StreamError(str(exc), anthropic_status(routing_status(exc)[0])[1]) from exc
        if routed.status == 200 and routed.content_type.startswith("text/event-stream"):
            return routed
        try:
            body = b"".join([chunk async for chunk in routed.chunks()])
        except UpstreamError as exc:
            raise StreamError(f"the worker failed: {exc}") from exc
        raise StreamError(_engine_message(body), anthropic_status(routed.status)[1] if routed.status != 200
                          else "api_error")
