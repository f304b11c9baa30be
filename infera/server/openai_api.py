"""OpenAI endpoints: thin handlers that validate, route and relay."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from infera.protocols.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    ValidationError,
    check_chat,
    check_completion,
    error_body,
    first_error,
    strip_system_nonces,
)
from infera.router.errors import RoutingError
from infera.router.router import Router, RouteRequest
from infera.server.errors import openai_error, openai_routing_error
from infera.server.hot_routes import Endpoint
from infera.server.intake import IntakeError, take_quick
from infera.server.metrics import EndpointAccounts, ServerMetrics
from infera.server.relay import (
    ClientWatch,
    Outcome,
    SseRelay,
    collect_or_disconnect,
    dispatch_or_disconnect,
    read_headers,
    worker_raw_headers,
)
from infera.server.responses import AfterWrite, JsonResponse, WholeResponse
from infera.server.tally import usage_of
from infera.transport.base import UpstreamError


def describe(exc: ValidationError, payload: dict[str, Any]) -> tuple[str, str | None]:
    """An OpenAI schema violation as (message, param)."""
    return first_error(exc)


class OpenAIHandlers:
    def __init__(self, router: Router, metrics: ServerMetrics, max_body_bytes: int,
                 strip_patterns: Sequence[str]) -> None:
        self.router = router
        self.metrics = metrics
        self.max_body = max_body_bytes
        self.patterns = [re.compile(p) for p in strip_patterns if p]

    def routes(self) -> APIRouter:
        api = APIRouter()
        # Plain Starlette routes on the hot path: the handlers read the raw request themselves,
        # so FastAPI's dependency solving and response serialisation would be pure overhead.
        api.add_route("/v1/chat/completions", self.chat, methods=["POST"])
        api.add_route("/v1/completions", self.completions, methods=["POST"])
        api.add_api_route("/v1/models", self.list_models, methods=["GET"])
        return api

    def hot_routes(self) -> dict[str, Endpoint]:
        """The routes served past FastAPI's routing stack (:mod:`infera.server.hot_routes`): :meth:`chat` and
        :meth:`completions`, as :meth:`_handle` called directly (no coroutine of their own in between)."""
        return {"/v1/chat/completions": partial(self._handle, kind="chat", path="/v1/chat/completions"),
                "/v1/completions": partial(self._handle, kind="completion", path="/v1/completions")}

    async def list_models(self) -> JsonResponse:
        created = int(time.time())
        data = [{"id": m, "object": "model", "created": created, "owned_by": "infera"}
                for m in self.router.view.models()]
        return JsonResponse({"object": "list", "data": data})

    async def chat(self, request: Request) -> Response:
        return await self._handle(request, "chat", "/v1/chat/completions")

    async def completions(self, request: Request) -> Response:
        return await self._handle(request, "completion", "/v1/completions")

    def complete(self, outcome: Outcome) -> None:
        """The end of a request's accounting: status, duration and the engine's token counts (and, for a
        whole answer, its time to first byte, measured before the answer and recorded after it)."""
        self.metrics.accounts(outcome.path).record(outcome.status, outcome.started, outcome.ttft, outcome.usage)

    async def _handle(self, request: Request, kind: Literal["chat", "completion"], path: str) -> Response:
        """The response: a relayed stream (it reports its own end to :meth:`complete`), or any other answer with its
        :class:`Accounting` as its background (for a whole answer from a worker, with its time to first byte),
        recorded after it is written."""
        started = time.perf_counter()
        accounts = self.metrics.accounts(path)
        schema: type[ChatCompletionRequest | CompletionRequest] = (
            ChatCompletionRequest if kind == "chat" else CompletionRequest)
        strip = self._strip if kind == "chat" else None
        quick = check_chat if kind == "chat" else check_completion  # pydantic only for what they do not pass
        try:
            intake = await take_quick(request, self.max_body, schema, describe, quick, strip)
        except IntakeError as exc:
            return _accounted(openai_error(exc.status, str(exc), param=exc.param), accounts, started)
        body, payload, parsed = intake.body, intake.payload, intake.parsed
        view = self.router.view
        if not view.serves(parsed.model):
            if not view.has_workers():
                return _accounted(openai_error(503, "no workers are available"), accounts, started)
            return _accounted(openai_error(404, f"The model '{parsed.model}' does not exist", "not_found_error",
                                              "model"), accounts, started)
        forwarded, worker_hint, prefill_hint = read_headers(request)
        req = RouteRequest(kind=kind, path=path, body=body, payload=payload, model=parsed.model,
                           max_tokens=parsed.output_limit(), worker_hint=worker_hint, prefill_hint=prefill_hint)
        watch = ClientWatch.of(request)
        relayed = False
        try:
            routed = await dispatch_or_disconnect(self.router, watch, req, forwarded)
            if routed is None:
                return _accounted(Response(status_code=499), accounts, started)
            if isinstance(routed, RoutingError):
                return _accounted(openai_routing_error(routed), accounts, started)
            ttft = time.perf_counter() - started
            if routed.content_type.startswith("text/event-stream"):
                self.metrics.observer(self.metrics.ttft, path)(ttft)
                relayed = True  # the relay stops the watch when the stream ends
                return SseRelay(routed, watch, path, started, worker_raw_headers(routed), _error_event,
                                self.metrics.observer(self.metrics.itl, path), self.complete,
                                self.metrics.buckets(self.metrics.itl, path))
            try:
                collected = await collect_or_disconnect(watch, routed)
            except UpstreamError as exc:
                failed = openai_error(exc.status, f"the worker failed before the response was complete: {exc}")
                return _accounted(failed, accounts, started, ttft)
        finally:
            if not relayed:
                watch.stop()
        if collected is None:
            return _accounted(Response(status_code=499), accounts, started, ttft)
        whole = WholeResponse(collected, routed.status, routed.content_type, worker_raw_headers(routed))
        return _accounted(whole, accounts, started, ttft)

    def _strip(self, payload: dict[str, Any], parsed: Any) -> bool:
        return strip_system_nonces(payload, self.patterns)


class Accounting(AfterWrite):
    """A whole response's accounting, run as its ``background``: after the body has been sent, so
    that the client's answer does not wait for the metrics (at one request in flight, the
    added latency is the frontend's time between the request's arrival and the answer's write)."""

    # the response's status and body, not the response: it holds this as its ``background``, and that reference
    # cycle kept every answered request's response and accounting alive until a GC collection
    __slots__ = ("_accounts", "_body", "_started", "_status", "_ttft")

    def __init__(self, accounts: EndpointAccounts, response: Response, started: float,
                 ttft: float | None = None) -> None:  # no super().__init__: nothing of it is used
        self._accounts = accounts
        self._status = response.status_code
        self._body = response.body
        self._started = started
        self._ttft = ttft

    def run(self) -> None:
        status = self._status
        usage = usage_of(bytes(self._body)) if status == 200 else None
        self._accounts.record(str(status), self._started, self._ttft, usage)  # what complete() records of it


def _accounted(response: Response, accounts: EndpointAccounts, started: float, ttft: float | None = None) -> Response:
    """``response`` with its :class:`Accounting` as its background."""
    response.background = Accounting(accounts, response, started, ttft)
    return response


def _error_event(exc: UpstreamError) -> bytes:
    """A failure mid-stream, as the last SSE event of the stream."""
    event = error_body(f"the worker failed mid-stream: {exc}", "upstream_error", code=exc.status)
    return b"data: " + orjson.dumps(event) + b"\n\n"
