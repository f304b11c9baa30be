"""A uvicorn server run inside the test's own event loop, on a free 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import uvicorn


@contextlib.asynccontextmanager
async def uvicorn_port(config: uvicorn.Config) -> AsyncIterator[int]:
    """Serve ``config`` until the block ends; yields the port once uvicorn says it has started."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and not task.done(), "uvicorn did not start"
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
