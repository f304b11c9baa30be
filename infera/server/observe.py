"""Observe: the ASGI middleware that begins and ends each inference request's telemetry.

It makes the request's record current (the router's hooks add the intake, tokenize, pick and leg
spans and the decision to it; its id is the ``x-request-id`` that RequestIdMiddleware, outside this
one, put in the headers), reads the status and the output token count off the response as it
passes (the usage the worker reported, else the number of streamed events), and at the end closes
the root span and writes the request line. Paths other than the inference endpoints pass straight
through. :class:`Observation` is one request's part of it, also used by the lean hot path
(:mod:`infera.server.lean`), which calls no middleware.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infera.telemetry.record import bind, unbind
from infera.telemetry.tracing import Telemetry

TRACED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages"})
_WANTED = {b"traceparent": 0, b"tracestate": 1, b"x-request-id": 2}  # the headers read, by slot
# (method, path) -> the root span's name and its attributes from the request (a template the root copies when
# the trace is recorded: no dict per sampled-out request); TRACED paths: a handful
_ROOTS: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}
_USAGE = re.compile(rb'"(?:completion_tokens|output_tokens)":\s*(\d+)')


class Observation:
    """One traced request: its record made current at creation; :meth:`see` each response message;
    :meth:`failed` on an exception; :meth:`close` at the end (the root span and the request line)."""

    __slots__ = ("_token", "events", "path", "record", "telemetry")

    def __init__(self, telemetry: Telemetry, scope: Scope) -> None:
        path = scope["path"]
        found: list[str | None] = [None, None, None]  # traceparent, tracestate, x-request-id: the first of each
        wanted = _WANTED.get
        for key, value in scope["headers"]:
            slot = wanted(key)
            if slot is not None and found[slot] is None:
                found[slot] = value.decode("latin-1")
        method = scope.get("method", "POST")
        root = _ROOTS.get((method, path))
        if root is None:
            root = _ROOTS[(method, path)] = (f"{method} {path}", {"http.request.method": method, "url.path": path})
        self.telemetry = telemetry
        self.path = path
        self.record = record = telemetry.begin(root[0], found[0], found[2], root[1], found[1])
        self._token: Any = bind(record)
        self.events = 0

    def see(self, message: Message) -> None:
        body = message.get("body")
        if body:  # only an http.response.body has one
            self.body(body)
        elif message["type"] == "http.response.start":
            self.record.status = message["status"]  # x-request-id: RequestIdMiddleware, outside this one

    def body(self, body: bytes | None) -> None:
        if body:
            record = self.record
            if b"_tokens" in body and (found := _USAGE.findall(body)):
                record.output_tokens = int(found[-1])
            elif record.output_tokens < 0:
                self.events += body.count(b"data: ")

    def failed(self, exc: BaseException) -> None:
        record = self.record
        record.error = f"{type(exc).__name__}: {exc}"
        record.status = record.status or 500

    def close(self) -> None:
        unbind(self._token)
        record = self.record
        if record.output_tokens < 0 and self.events:
            record.output_tokens = max(0, self.events - 1)  # the events less the closing [DONE] or message_stop
        self.telemetry.end(record, self.path)


class Observe:
    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") not in TRACED:
            await self.app(scope, receive, send)
            return
        observation = Observation(self.telemetry, scope)
        see = observation.see

        def observe(message: Message) -> Awaitable[None]:
            # a plain function handing back send's awaitable: no coroutine of its own per message (a
            # stream's messages went through one each, ~2 µs apiece in a loop, more in a loaded frontend)
            see(message)
            return send(message)

        try:
            await self.app(scope, receive, observe)
        except BaseException as exc:
            observation.failed(exc)
            raise
        finally:
            observation.close()
