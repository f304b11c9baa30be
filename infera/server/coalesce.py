"""One write per small response: uvicorn's protocol with the status line and headers held back
until the body's first write, then sent with it.

uvicorn writes a response's head as soon as the app sends ``http.response.start`` and its body at
the next ``http.response.body``: two writes, two TCP segments with TCP_NODELAY, and a client that
wakes up for the head, parses it and sleeps again until the body comes. Measured at one request in
flight (bench/README.md, "Issue 15, fourth round"), the second write and the client's extra wake-up
were a visible part of the frontend's added latency. Here the head waits for the body's first
write, which an app sends in the same step of its task; if the app awaits something in between (a
stream whose first chunk is late), the head goes out by itself at the end of the event loop's
current iteration, so a client never waits longer for the headers than before. An interim
``100 Continue`` (written before the response starts) is never held.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from infera.server.nodelay import NoDelayHttpToolsProtocol

JOIN_BYTES = 64 * 1024  # a body above this is written with the head by writelines (no copy)


class HeadHold:
    """The transport as one request's cycle sees it: the first write after the response started
    (the head) is held until the next write or the end of the loop iteration; the rest passes."""

    __slots__ = ("_cycle", "_head", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: RequestResponseCycle,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._cycle = cycle
        self._loop = loop
        self._head: bytes | None = None
        self._held = False  # a head was held once (only the first write of a response is one)

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if len(data) < JOIN_BYTES:
                self._transport.write(head + data)
            else:
                self._transport.writelines((head, data))
            return
        if not self._held and self._cycle.response_started:
            self._held = True
            self._head = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def idle(self) -> bool:
        """No head is held: the cycle may write to :meth:`inner` directly from now on."""
        return self._head is None

    def inner(self) -> asyncio.Transport:
        return self._transport

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def hold_heads(cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop) -> None:
    """Give ``cycle`` a :class:`HeadHold` over its transport (once)."""
    if not isinstance(cycle.transport, HeadHold):
        cycle.transport = HeadHold(cycle.transport, cycle, loop)  # type: ignore[assignment]


class CoalescingHttpToolsProtocol(NoDelayHttpToolsProtocol):
    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # the hold is put on as the request's task starts (nothing writes to a cycle before): a subclass that
        # answers a request in one write of its own starts it without calling this (infera.server.lean)
        hold_heads(cycle, self.loop)
        super()._start_asgi_task(cycle, app)
