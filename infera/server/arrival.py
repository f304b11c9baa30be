"""An incoming request's parse callbacks with fewer Python frames: uvicorn's and the deadlines', one frame each.

httptools calls its protocol back from C at each step of a request (``on_message_begin``, ``on_url``,
``on_header`` once per header field, ``on_headers_complete``, ``on_body``, ``on_message_complete``), and
``data_received`` feeds it. In uvicorn's protocol under infera's subclasses, ``data_received``,
``on_message_begin``, ``on_headers_complete`` and ``on_message_complete`` were each two or three frames (the
deadlines' override, uvicorn's, the keep-alive hook), and ``on_header`` a Python frame per field (a client's
usual request has seven): ~25 frames and ~700 bytecodes before the request's task started (bench/README.md,
"Issue 15, seventeenth round: the incoming request's handling"). Here:

- ``data_received``, ``on_message_begin`` and ``on_message_complete`` do what uvicorn's and the deadlines' did, in
  that order, in one frame;
- ``on_header`` is a :class:`HeaderSink` from the C extension (``csrc/headers.c``) when it is built: httptools
  reads the attribute once, when the parser is made, and calls the sink with no Python frame; it appends to the
  current request's header list and notes an ``Expect: 100-continue``, as uvicorn's ``on_header`` does (without
  the C part, uvicorn's own);
- ``on_headers_complete`` stays the deadlines' and uvicorn's: a subclass (``infera.server.lean``) takes its hot
  requests past them;
- ``on_body`` keeps a body's first piece as the bytes httptools made of it, where uvicorn's copies every piece into
  the cycle's bytearray (and the lean path's ``bytes(cycle.body)`` copied it out again): a 2-3k-token chat body
  (10-20 KB) read in one piece is not copied twice per request. A second piece turns it into a bytearray, as
  uvicorn's (appends stay linear); uvicorn's ``receive`` takes either (``bytes(cycle.body)``).
"""

from __future__ import annotations

from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT

from infera.kv.native import load
from infera.server.deadlines import DeadlineHttpToolsProtocol


def header_sink() -> Any:
    """A new C header sink, or None when the C extension is not built (or ``INFERA_PURE_PYTHON`` is set)."""
    native = load()
    return native.HeaderSink() if native is not None and hasattr(native, "HeaderSink") else None


class ArrivalHttpToolsProtocol(DeadlineHttpToolsProtocol):
    """The deadlines' protocol with its per-request parse callbacks in one frame each (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # before uvicorn's __init__ makes the parser, which reads ``on_header`` once
        self._sink = sink = header_sink()
        if sink is not None:
            self.on_header = sink  # type: ignore[method-assign]
        super().__init__(*args, **kwargs)

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received (its _unset_keepalive_if_required is the deadlines': no timer to cancel), then
        # the deadlines' timers, as DeadlineHttpToolsProtocol.data_received does around it
        self._idle_since = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        if self._in_headers:
            if self._header_timer is None and not self.transport.is_closing():
                self._arm_headers()
        elif self._in_body and self._body_timer is None and self.body_timeout > 0 and not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_late)

    def on_message_begin(self) -> None:
        # uvicorn's, then the deadlines'
        self.url = b""
        self.expect_100_continue = False
        headers: list[tuple[bytes, bytes]] = []
        self.headers = headers
        sink = self._sink
        if sink is not None:
            sink.headers = headers
            sink.expect = False
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": headers,
            "state": self.app_state.copy(),
        }
        self._in_headers = True

    def on_headers_complete(self) -> None:
        sink = self._sink
        if sink is not None:
            self.expect_100_continue = sink.expect
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        # uvicorn's, without the copy of a first piece (see the module docstring)
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        kept: Any = cycle.body
        if not kept:
            cycle.body = kept = body  # type: ignore[assignment]
        elif type(kept) is bytes:
            cycle.body = kept = bytearray(kept)
            kept += body
        else:
            kept += body
        if len(kept) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        # the deadlines', then uvicorn's
        self._in_body = False
        timer = self._body_timer
        if timer is not None:
            timer.cancel()
            self._body_timer = None
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        cycle.more_body = False
        cycle.message_event.set()
