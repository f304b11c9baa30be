"""uvicorn's httptools protocol with TCP_NODELAY set on every client connection.

Streamed chunks are small writes; with Nagle's algorithm on, the kernel holds each one
back until the previous is acknowledged, adding up to a delayed-ACK timeout (40 ms on
Linux) between tokens. uvloop happens to set the option already; asyncio's default
loop does too on most platforms; this makes it a guarantee rather than a coincidence.
"""

from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def set_nodelay(transport: asyncio.BaseTransport) -> bool:
    """Set TCP_NODELAY on the transport's socket; False if it is not a TCP socket."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True


class NoDelayHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport)
        super().connection_made(transport)
