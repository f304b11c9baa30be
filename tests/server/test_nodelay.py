from __future__ import annotations

import asyncio
import socket

from infera.server.nodelay import set_nodelay


async def test_set_nodelay_on_an_accepted_tcp_connection() -> None:
    accepted: list[asyncio.BaseTransport] = []
    arrived = asyncio.Event()

    class Grab(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.append(transport)
            arrived.set()

    server = await asyncio.get_running_loop().create_server(Grab, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    await arrived.wait()
    sock = accepted[0].get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
    assert set_nodelay(accepted[0])
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    writer.close()
    server.close()
    await server.wait_closed()
