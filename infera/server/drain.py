"""Graceful drain on SIGTERM: stop accepting, answer what still arrives, finish what is in flight.

uvicorn's own shutdown closes every idle keep-alive connection at once; a request a client has
just sent on one is then reset with no answer (lost: the client cannot tell whether it ran), as
is every connection the kernel completed but the server had not yet accepted when its listener
closed. Here the listener first stops completing handshakes (a socket filter drops SYNs, Linux),
the connections already queued are accepted for :data:`BACKLOG_S`, then it closes (new
connections are refused, which a client can safely retry); then,
for up to ``drain_seconds``, every open connection keeps being served but each response carries
``Connection: close``, so a client's pooled connection closes right after its next answer, and
``/health`` answers 503 (a load balancer stops sending). The drain ends when every connection is
closed, or idle with no request started for :data:`QUIET_S`, or at the bound; uvicorn's shutdown
then closes what is idle and gives in-flight requests the rest of the bound before cancelling them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import socket
import struct
import time
from collections.abc import Iterable

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infera.server.quiet import QuietServer

log = logging.getLogger(__name__)

QUIET_S = 0.5  # an open connection that carried no request for this long is taken as unused
BACKLOG_S = 0.2  # after SYNs stop being answered: time for the loop to accept what the kernel queued
SO_ATTACH_FILTER = 26  # Linux
_DROP_ALL = (ctypes.c_uint8 * 8)(*struct.pack("HBBI", 0x06, 0, 0, 0))  # classic BPF: "ret #0" (drop)
DRAINING_BODY = b'{"status":"draining","workers":0}'


class DrainState:
    """Shared by the middleware (which marks requests) and the server (which begins the drain)."""

    def __init__(self) -> None:
        self.draining = False
        self.last_request = 0.0  # monotonic time the last request started

    def quiet_for(self) -> float:
        return time.monotonic() - self.last_request


class DrainMiddleware:
    """Outermost ASGI middleware: while draining, ``Connection: close`` on every response and a
    503 readiness answer."""

    def __init__(self, app: ASGIApp, state: DrainState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = self.state
        state.last_request = time.monotonic()
        if not state.draining:
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": DRAINING_BODY})
            return

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)


def refuse_new_handshakes(listeners: Iterable[object]) -> bool:
    """Make listening sockets drop incoming SYNs (queued connections stay acceptable); False where
    the platform has no socket filters."""
    prog = struct.pack("HxxxxxxQ", 1, ctypes.addressof(_DROP_ALL))  # struct sock_fprog
    done = False
    for server in listeners:
        for sock in getattr(server, "sockets", None) or ():
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
                done = True
    return done


def _idle(connection: object) -> bool:
    cycle = getattr(connection, "cycle", None)
    return cycle is None or bool(getattr(cycle, "response_complete", True))


class DrainingServer(QuietServer):
    """uvicorn's server (ticking once a second: server/quiet.py) with the drain above before its own
    shutdown, all within ``drain_seconds``."""

    def __init__(self, config: uvicorn.Config, state: DrainState, drain_seconds: float) -> None:
        super().__init__(config)
        self.drain_state = state
        self.drain_seconds = drain_seconds

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_seconds
        self.drain_state.draining = True
        if refuse_new_handshakes(self.servers):
            await asyncio.sleep(BACKLOG_S)  # the loop accepts what the kernel had queued
        else:
            log.warning("no socket filter on this platform: connections queued at shutdown may be reset")
        for server in self.servers:
            server.close()  # stop accepting: new connections are refused
        for sock in sockets or []:
            sock.close()
        while loop.time() < deadline and not self.force_exit:
            connections = self.server_state.connections
            if not connections:
                break
            if all(_idle(c) for c in connections) and self.drain_state.quiet_for() >= QUIET_S:
                break
            await asyncio.sleep(0.05)
        self.config.timeout_graceful_shutdown = max(1, math.ceil(deadline - loop.time()))
        await super().shutdown(sockets=None)
