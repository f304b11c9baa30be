"""The hot POSTs' lean way through the server: no ASGI middleware chain, no response messages.

At one request in flight the frontend's added latency is the Python between a request's arrival
and the engine write, and between the engine's answer and the client's (bench/README.md, "Issue
15, fourth round: added latency"). A POST to an inference route (``/v1/chat/completions``,
``/v1/completions``, ``/v1/messages``) passed the drain middleware, FastAPI's app, Starlette's
server-error middleware, the request-id middleware, ``Observe``, and its response's two ASGI
messages went back out through each of them and uvicorn's ``send`` (which re-checks every header
against two regexes). Here the protocol starts such a request's task on :meth:`LeanPath.run`
instead, which does what those layers did, in one place:

- the drain's mark (last request time; while draining, ``Connection: close``);
- the direct mode's default worker header;
- the request id (kept or made, in the request's headers, in the response's; under
  ``/v1/messages`` in an error body too);
- ``Observe``'s record (current for the request, status and output tokens off the response);
- the server-error handler's 500 in the API's shape for an unexpected exception (then logged and
  the connection closed, as uvicorn does);
- a whole response (every answer but a stream) written as head and body in one write, the
  response's state kept on uvicorn's cycle (keep-alive, pipelining, flow control, the access log);
  a stream goes through the cycle's ``send`` with the same header and body effects, except an ``SseRelay``'s start,
  which its ``CycleWriter`` writes with the first chunk in one write (``infera.server.splice``).

The protocol starts such a request where its headers end: for a request target that is exactly a hot route's
path (no query, no escapes; no upgrade, root path or concurrency limit) it sets the scope's path fields and makes
the cycle itself, without uvicorn's URL parse and checks (every other request goes through uvicorn's
``on_headers_complete`` as before; the parse callbacks are ``infera.server.arrival``'s). What stays uvicorn's:
parsing (httptools), the request's cycle and its ``receive`` (a body still arriving, chunked or not, ``Expect:
100-continue``, the body deadline's 408, disconnects), keep-alive and pipelining. A body already whole when the
request's task starts (the usual request, read in one piece) is handed to the handler's intake in the scope
(``intake.WHOLE_BODY``), without a ``receive()`` round trip.
The client watch needs no task here: the protocol tells the request's :class:`Disconnects`.
An app with a middleware this module does not know gets no lean path (:meth:`LeanPath.of`), so
it cannot skip a behaviour silently; nor does a request the concurrency limit refuses.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Send
from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from infera.server.arrival import ArrivalHttpToolsProtocol
from infera.server.auth import AdminTokenMiddleware, is_admin_path
from infera.server.coalesce import HeadHold, hold_heads
from infera.server.deadlines import DeadlineHttpToolsProtocol
from infera.server.direct import DefaultWorkerHeader, with_default_worker
from infera.server.drain import DrainState
from infera.server.hot_routes import Endpoint, InferaApp
from infera.server.intake import WHOLE_BODY
from infera.server.observe import TRACED, Observation, Observe
from infera.server.relay import DISCONNECTS, Disconnects, SseRelay
from infera.server.request_id import ANTHROPIC_PREFIX, HEADER, RequestIdMiddleware, error_with_id, id_sender, take_id
from infera.server.responses import AfterWrite
from infera.server.splice import CycleWriter
from infera.telemetry.tracing import Telemetry

ErrorHandler = Callable[[Request, Exception], Response | Awaitable[Response]]
CLOSE = (b"connection", b"close")


def _nothing() -> None:
    pass


class LeanPath:
    """The lean path of one app (see the module docstring); build it with :meth:`of`."""

    def __init__(self, app: InferaApp, endpoints: Mapping[str, Endpoint], drain: DrainState, *,
                 on_error: ErrorHandler, telemetry: Telemetry | None, default_worker: str | None) -> None:
        self.app = app
        self.endpoints = dict(endpoints)
        self.drain = drain
        self.on_error = on_error
        self.telemetry = telemetry
        self.default_worker = (b"x-worker-instance-id", default_worker.encode()) if default_worker else None

    @classmethod
    def of(cls, app: object, drain: DrainState) -> LeanPath | None:
        """The lean path for ``app``, or None when ``app`` has something it would skip: not an
        :class:`InferaApp` with hot routes, a middleware other than the request id, ``Observe``, the admin
        token (no hot route is an admin path) and the default worker, or no ``Exception`` handler."""
        if not isinstance(app, InferaApp):
            return None
        endpoints = app.hot_endpoints()
        on_error = app.exception_handlers.get(Exception)
        if not endpoints or on_error is None or any(is_admin_path(p) for p in endpoints):
            return None
        telemetry: Telemetry | None = None
        default_worker: str | None = None
        has_id = False
        for middleware in app.user_middleware:
            kind: Any = middleware.cls
            kwargs: dict[str, Any] = dict(middleware.kwargs)
            if kind is RequestIdMiddleware and not middleware.args:
                has_id = True
            elif kind is Observe and set(kwargs) == {"telemetry"} and not middleware.args:
                telemetry = kwargs["telemetry"]
            elif kind is DefaultWorkerHeader and set(kwargs) == {"worker"} and not middleware.args:
                default_worker = kwargs["worker"]
            elif kind is not AdminTokenMiddleware:
                return None
        if not has_id or (telemetry is not None and not set(endpoints) <= TRACED):
            return None
        return cls(app, endpoints, drain, on_error=on_error, telemetry=telemetry, default_worker=default_worker)

    def takes(self, scope: Any) -> bool:
        return scope["method"] == "POST" and scope["path"] in self.endpoints

    async def run(self, cycle: RequestResponseCycle) -> None:
        """The request's task: what uvicorn's ``run_asgi`` does around an app, around :meth:`serve`."""
        try:
            await self.serve(cycle)
        except BaseException as exc:
            cycle.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not cycle.response_started:
                _hold_heads(cycle)  # uvicorn's 500 is two sends: in one write, as on the ASGI stack
                await cycle.send_500_response()
            else:
                cycle.transport.close()
        else:
            if not cycle.response_complete and not cycle.disconnected:
                cycle.logger.error("ASGI callable returned without completing response.")
                cycle.transport.close()
        finally:
            cycle.on_response = _nothing
            # break the request's reference cycles, so that its objects die by reference count now, not in a
            # young GC collection later (thousands of such objects per collection; bench/README.md, "Issue 15,
            # eighth round: why a live kv-aware request costs more than its stages"): the scope's Disconnects holds
            # this task and the watch's callback (watch -> Disconnects -> watch), the cycle its HeadHold (-> cycle)
            scope: Any = cycle.scope
            disconnects = scope.get(DISCONNECTS)
            if disconnects is not None:
                disconnects.action = None
                disconnects.task = None
            hold: object = cycle.transport  # a HeadHold where a stream or a 500 put one
            if isinstance(hold, HeadHold) and hold.idle():
                cycle.transport = hold.inner()

    async def serve(self, cycle: RequestResponseCycle) -> None:
        scope: Any = cycle.scope
        drain = self.drain
        drain.last_request = time.monotonic()
        closing = drain.draining  # as the drain middleware: decided when the request starts
        if self.default_worker is not None:
            scope["headers"] = with_default_worker(scope["headers"], self.default_worker)
        rid, headers = take_id(scope["headers"])
        if headers is not None:
            scope["headers"] = headers
        scope["app"] = self.app
        if not cycle.more_body and not cycle.waiting_for_100_continue and not cycle.disconnected:
            # the whole body is in (the usual request, read in one piece): the handler's intake takes it as it
            # is, without a receive() round trip; what receive() would have done to the cycle is done here
            scope[WHOLE_BODY] = bytes(cycle.body)
            cycle.body = bytearray()
            cycle.message_event.clear()
            cycle.flow.resume_reading()
        request = Request(scope, cycle.receive)  # type: ignore[arg-type]
        observation = Observation(self.telemetry, scope) if self.telemetry is not None else None
        try:
            try:
                response = await self.endpoints[scope["path"]](request)
                await self.answer(cycle, response, rid, closing, observation)
            except Exception as exc:
                if observation is not None:
                    observation.failed(exc)
                if not cycle.response_started:  # the server-error handler's answer: no id, past Observe
                    error = self.on_error(request, exc)
                    if inspect.isawaitable(error):
                        error = await error
                    assert isinstance(error, Response)
                    await self.write(cycle, error.status_code, error.raw_headers, bytes(error.body), closing)
                raise
            except BaseException as exc:
                if observation is not None:
                    observation.failed(exc)
                raise
        finally:
            if observation is not None:
                observation.close()

    async def answer(self, cycle: RequestResponseCycle, response: Response, rid: bytes, closing: bool,
                     observation: Observation | None) -> None:
        """Send ``response``: a whole one in one write, a stream through the cycle's ``send`` (a relay's start with
        its first chunk and its body through its :class:`CycleWriter`)."""
        path: str = cycle.scope["path"]
        if type(response).__call__ is not Response.__call__:  # a stream (its own __call__)
            send: Send = cast(Send, cycle.send)
            send = id_sender(_closing(send) if closing else send, rid, path)
            if observation is not None:
                send = _observed(send, observation)
            if isinstance(response, SseRelay):  # its start with its first chunk, and its body, past the sends above
                response.direct = CycleWriter(cycle, observation, rid, closing, _hold_heads)
            else:
                _hold_heads(cycle)  # its head waits for its first chunk, as on the ASGI stack (infera.server.coalesce)
            await response(cast(Any, cycle.scope), cast(Receive, cycle.receive), send)
            return
        status = response.status_code
        body = bytes(response.body)
        headers = [*response.raw_headers, (HEADER, rid)]
        if observation is not None:
            observation.record.status = status
            observation.body(body)
        if status >= 400 and path.startswith(ANTHROPIC_PREFIX) and _json(headers):
            with_id = error_with_id(body, rid.decode())
            if with_id is not None:
                body = with_id
                headers = [(k, str(len(body)).encode() if k == b"content-length" else v) for k, v in headers]
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        self.write_now(cycle, status, headers, body, closing)
        background = response.background
        if background is not None:
            if isinstance(background, AfterWrite):
                background.run()  # no coroutine of its own
            else:
                await background()

    async def write(self, cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                    closing: bool) -> None:
        """A whole response as uvicorn's ``send`` would write it (its two messages), in one write."""
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        self.write_now(cycle, status, headers, body, closing)

    def write_now(self, cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                  closing: bool) -> None:
        """:meth:`write` once the client can take it (the drain waited for); nothing when the client is gone."""
        if cycle.disconnected:
            return
        if cycle.response_started:
            raise RuntimeError("Unexpected ASGI message 'http.response.start' sent, after response already started.")
        if cycle.access_log:
            cycle.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(cycle.scope), cycle.scope["method"],
                                     get_path_with_query_string(cycle.scope), cycle.scope["http_version"], status)
        content = [STATUS_LINE[status]]
        for name, value in cycle.default_headers:
            content += (name, b": ", value, b"\r\n")
        keep_alive = cycle.keep_alive and not closing
        for name, value in headers:
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            if name == b"connection":
                if closing:
                    continue  # the drain's own close replaces it
                if b"close" in [token.lower().strip() for token in value.split(b",")]:
                    keep_alive = False
            content += (name, b": ", value, b"\r\n")
        if not keep_alive:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        cycle.waiting_for_100_continue = False
        cycle.transport.write(b"".join(content))  # before response_started: the head-holding transport passes it
        cycle.response_started = True
        cycle.response_complete = True
        cycle.keep_alive = keep_alive
        cycle.message_event.set()
        if not keep_alive:
            cycle.transport.close()
        cycle.on_response()


def _hold_heads(cycle: RequestResponseCycle) -> None:
    """The coalescing protocol's :class:`HeadHold` on a lean request that writes its answer in several sends (a
    stream, uvicorn's 500): a whole answer is one write of its own and needs none. The loop is the request's
    task's (the protocol keeps it on the request's :class:`Disconnects`; ``get_running_loop()`` is a getpid)."""
    scope: Any = cycle.scope
    disconnects: Disconnects | None = scope.get(DISCONNECTS)
    task = disconnects.task if disconnects is not None else None
    hold_heads(cycle, task.get_loop() if task is not None else asyncio.get_running_loop())


def _json(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k == b"content-type" and v.startswith(b"application/json") for k, v in headers)


def _closing(send: Send) -> Send:
    """The drain middleware's send: ``Connection: close`` on the response."""
    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, CLOSE]}
        await send(message)
    return closing


def _observed(send: Send, observation: Observation) -> Send:
    see = observation.see

    def observe(message: Message) -> Awaitable[None]:
        see(message)
        return send(message)
    return observe


class LeanHttpToolsProtocol(ArrivalHttpToolsProtocol):
    """The server's protocol with the lean path (set ``lean`` with :func:`with_lean`)."""

    lean: LeanPath | None = None
    hot: dict[bytes, str] = {}  # noqa: RUF012 (read only) the lean path's routes by their exact request target

    def on_headers_complete(self) -> None:
        # the deadlines' and the arrival's part (DeadlineHttpToolsProtocol's, ArrivalHttpToolsProtocol's)
        self._in_headers = False
        self._in_body = True
        timer = self._header_timer
        if timer is not None:
            timer.cancel()
            self._header_timer = None
        sink = self._sink
        if sink is not None:
            self.expect_100_continue = sink.expect
        parser = self.parser
        path = self.hot.get(self.url)
        if (path is None or parser.get_method() != b"POST" or parser.should_upgrade() or self.root_path
                or self.limit_concurrency is not None):
            HttpToolsProtocol.on_headers_complete(self)  # uvicorn's: every other request as it was
            return
        # uvicorn's on_headers_complete for a POST to a hot route's exact path (its parse_url gives the path
        # itself and no query; no upgrade, no root path, no concurrency limit), and the lean request's task
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = "POST"
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = path
        scope["raw_path"] = self.url
        scope["query_string"] = b""
        existing = self.cycle
        self.cycle = cycle = RequestResponseCycle(
            scope=scope, transport=self.transport, flow=self.flow, logger=self.logger,
            access_logger=self.access_logger, access_log=self.access_log,
            default_headers=self.server_state.default_headers, message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(), on_response=self.on_response_complete)
        if existing is None or existing.response_complete:
            lean: Any = self.lean
            disconnects = scope[DISCONNECTS] = Disconnects()  # type: ignore[literal-required]
            task = disconnects.task = self.loop.create_task(lean.run(cycle))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
        else:  # pipelined: started by on_response_complete, through _start_asgi_task
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        lean = self.lean
        if lean is None or app is not self.app or not lean.takes(cycle.scope):
            super()._start_asgi_task(cycle, app)
            return
        disconnects = cycle.scope[DISCONNECTS] = Disconnects()  # type: ignore[literal-required]
        task = disconnects.task = self.loop.create_task(lean.run(cycle))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        _tell(cycle)

    def _body_late(self) -> None:
        cycle = self.cycle
        super()._body_late()
        _tell(cycle)


def _tell(cycle: RequestResponseCycle | None) -> None:
    """A lean request's watch learns that its client is gone (uvicorn marked the cycle disconnected)."""
    if cycle is not None and cycle.disconnected:
        disconnects = cast(dict[str, Any], cycle.scope).get(DISCONNECTS)
        if disconnects is not None:
            disconnects.fire()


def with_lean(protocol: type[DeadlineHttpToolsProtocol], lean: LeanPath | None) -> type[DeadlineHttpToolsProtocol]:
    """``protocol`` (from :func:`infera.server.deadlines.with_deadlines`) with ``lean``'s hot path."""
    return type("LeanHttpToolsProtocol", (LeanHttpToolsProtocol, protocol), {"lean": lean, "hot": _hot(lean)})


def _hot(lean: LeanPath | None) -> dict[bytes, str]:
    """The request targets that are exactly a hot route's path (uvicorn's parse_url of them is the path itself)."""
    if lean is None:
        return {}
    return {path.encode(): path for path in lean.endpoints
            if path.isascii() and path.startswith("/") and not any(c in path for c in "%?#")}
