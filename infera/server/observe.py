"""Observe: the ASGI middleware that begins and ends each inference request's telemetry.

It makes the request's record current (the router's hooks add the intake, tokenize, pick and leg
spans and the decision to it; its id is the ``x-request-id`` that RequestIdMiddleware, outside this
one, put in the headers), reads the status and the output token count off the response as it
passes (the usage the worker reported, else the number of streamed events), and at the end closes
the root span and writes the request line. Paths other than the inference endpoints pass straight
through.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infera.telemetry.record import bind, unbind
from infera.telemetry.tracing import Telemetry

TRACED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages"})
_WANTED = {b"traceparent": 0, b"tracestate": 1, b"x-request-id": 2}  # the headers read, by slot
_USAGE = re.compile(rb'"(?:completion_tokens|output_tokens)":\s*(\d+)')


class Observe:
    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry
        self._names: dict[tuple[str, str], str] = {}  # (method, path) -> the root span's name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in TRACED:
            await self.app(scope, receive, send)
            return
        found: list[str | None] = [None, None, None]  # traceparent, tracestate, x-request-id: the first of each
        wanted = _WANTED.get
        for key, value in scope["headers"]:
            slot = wanted(key)
            if slot is not None and found[slot] is None:
                found[slot] = value.decode("latin-1")
        method = scope.get("method", "POST")
        name = self._names.get((method, path))
        if name is None:
            name = self._names[(method, path)] = f"{method} {path}"  # TRACED paths: a handful of names
        record = self.telemetry.begin(name, found[0], found[2], {"http.request.method": method, "url.path": path},
                                      found[1])
        token = bind(record)
        events = 0

        def observe(message: Message) -> Awaitable[None]:
            # a plain function handing back send's awaitable: no coroutine of its own per message (a
            # stream's messages went through one each, ~2 µs apiece in a loop, more in a loaded frontend)
            nonlocal events
            body = message.get("body")
            if body:  # only an http.response.body has one
                if b"_tokens" in body and (usage := _USAGE.findall(body)):
                    record.output_tokens = int(usage[-1])
                elif record.output_tokens < 0:
                    events += body.count(b"data: ")
            elif message["type"] == "http.response.start":
                record.status = message["status"]  # x-request-id: RequestIdMiddleware, outside this one
            return send(message)

        try:
            await self.app(scope, receive, observe)
        except BaseException as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            record.status = record.status or 500
            raise
        finally:
            unbind(token)
            if record.output_tokens < 0 and events:
                record.output_tokens = max(0, events - 1)  # the events less the closing [DONE] or message_stop
            self.telemetry.end(record, path)
