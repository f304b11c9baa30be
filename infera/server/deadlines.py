"""Client deadlines against slow-drip (slowloris) clients: uvicorn's HTTP protocol with two timers.

uvicorn bounds only the idle time between requests on a kept-alive connection; a client that
sends its headers or its body a byte at a time holds a connection (and a parser, and for a body
a running handler) for as long as it likes. Two deadlines, per request:

- **headers** (``--client-header-timeout``): from the connection's opening (first request) or
  the request's first byte (later requests on a kept-alive connection) to the end of its headers.
  Past it the connection is closed without an answer: no handler has run, nobody is waiting.
- **body** (``--client-body-timeout``): from the end of the headers to the end of the body. Past
  it the client gets a 408 in the shape of the API it called, and the connection is closed; the
  handler sees a disconnect and stops.

Neither applies once a request is complete: a long answer, a stream, or a graceful drain of
requests in flight is never cut by them. ``0`` turns a deadline off.

uvicorn's own idle deadline between requests (``--keep-alive-timeout``) is kept, with one timer per
idle stretch instead of one armed at every response and cancelled at the next request.
"""

from __future__ import annotations

import asyncio

import orjson

from infera.protocols.anthropic import error_body as anthropic_error_body
from infera.protocols.openai import error_body as openai_error_body
from infera.server.coalesce import CoalescingHttpToolsProtocol

ANTHROPIC_PREFIX = b"/v1/messages"


def timeout_answer(path: bytes, seconds: float) -> bytes:
    """The raw 408 response to a request whose body did not arrive within ``seconds``."""
    message = f"the request body did not arrive within {seconds:g}s (--client-body-timeout)"
    if path.startswith(ANTHROPIC_PREFIX):
        body = orjson.dumps(anthropic_error_body("timeout_error", message))
    else:
        body = orjson.dumps(openai_error_body(message, "timeout_error", None, 408))
    head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
    return head + body


class DeadlineHttpToolsProtocol(CoalescingHttpToolsProtocol):
    """Set the two deadlines (seconds) with :func:`with_deadlines`, which makes a subclass."""

    header_timeout: float = 10.0
    body_timeout: float = 60.0

    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None

    _in_headers = False  # a request has begun and its headers are not complete
    _in_body = False  # a request's headers are complete and its body is not

    _idle_since: float | None = None  # loop time of the last response, while no request follows it
    _idle_timer: asyncio.TimerHandle | None = None  # the keep-alive deadline: at or before _idle_since + timeout

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        super().connection_lost(exc)

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # a request came: a pending keep-alive timer finds the connection busy

    def on_response_complete(self) -> None:
        # uvicorn's, but the keep-alive timer is not armed at every response and cancelled at the next request
        # (~1 us each): one pending timer re-arms itself while requests keep coming, or closes the idle connection
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = now = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(now + self.timeout_keep_alive, self._idle_late)

    def _idle_late(self) -> None:
        self._idle_timer = None
        since = self._idle_since
        if since is None:
            return  # serving a request: its response arms the timer again
        due = since + self.timeout_keep_alive
        if self.loop.time() < due:
            self._idle_timer = self.loop.call_at(due, self._idle_late)
            return
        self.timeout_keep_alive_handler()

    def data_received(self, data: bytes) -> None:
        # The timers are armed only for a request that did not arrive whole in one read (the usual
        # request arrives whole: no timer to arm and cancel); the deadlines then count from the end of
        # this read, in the same loop iteration as the request's first byte or its headers' end.
        super().data_received(data)
        if self._in_headers:
            if self._header_timer is None and not self.transport.is_closing():
                self._arm_headers()
        elif self._in_body and self._body_timer is None and self.body_timeout > 0 and not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_late)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._in_body = True
        if self._header_timer is not None:  # _cancel_headers(), inline: once per request
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        if self._body_timer is not None:  # _cancel_body(), inline: once per request
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def _arm_headers(self) -> None:
        if self.header_timeout > 0:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _body_late(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            cycle.disconnected = True  # the handler's next receive() is a disconnect; its sends go nowhere
            cycle.message_event.set()
            self.transport.write(timeout_answer(self.url, self.body_timeout))
        self.transport.close()

    def _cancel_headers(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel(self) -> None:
        self._cancel_headers()
        self._cancel_body()


def with_deadlines(header_timeout: float, body_timeout: float) -> type[DeadlineHttpToolsProtocol]:
    """The protocol class to give ``uvicorn.run(http=...)``, with these deadlines in seconds."""
    return type("DeadlineHttpToolsProtocol", (DeadlineHttpToolsProtocol,),
                {"header_timeout": header_timeout, "body_timeout": body_timeout})
