"""An idle frontend's server loop wakes once a second, keeps the Date header right, and exits at once."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections.abc import AsyncIterator
from email.utils import formatdate, parsedate_to_datetime

import uvicorn
from hypothesis import example, given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from infera.config import load
from infera.config.server import ServerSettings
from infera.server import quiet
from infera.server.__main__ import server_for
from infera.server.drain import DrainingServer

REQUEST = b"GET /ping HTTP/1.1\r\nhost: x\r\n\r\n"


@given(st.integers(min_value=0, max_value=4_000_000_000),
       st.lists(st.floats(min_value=0, max_value=3, allow_nan=False), min_size=1, max_size=8),
       st.booleans(), st.booleans())
@example(0, [2.5, 2.9999996, 3.2], True, True)  # formatdate shows 2.9999996 as second 3 (rounds to the microsecond)
def test_the_default_headers_are_uvicorns_of_the_second_they_are_read_in(base: int, offsets: list[float],
                                                                         date_header: bool,
                                                                         server_header: bool) -> None:
    times = [base + offset for offset in offsets]  # reads within a few seconds of each other, in any order
    config = uvicorn.Config(app=PlainTextResponse("x"), date_header=date_header, server_header=server_header,
                            headers=[("x-extra", "1")])
    config.load()  # makes encoded_headers
    clock = iter(times)
    state = quiet.DatedState(config, clock=lambda: next(clock))
    for now in times:  # the wall clock may be set back
        date = [(b"date", formatdate(now, usegmt=True).encode())] if date_header else []
        assert state.default_headers == date + config.encoded_headers


@contextlib.asynccontextmanager
async def started(server: DrainingServer) -> AsyncIterator[tuple[str, int]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        yield sock.getsockname()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def frontend_server() -> DrainingServer:
    app = Starlette(routes=[Route("/ping", lambda request: PlainTextResponse("pong"))])
    return server_for(app, load(ServerSettings, ["--host", "127.0.0.1", "--port", "0",
                                                 "--router-policy", "round-robin"], {}))


async def date_of_a_request(address: tuple[str, int]) -> float:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(REQUEST)
    head = await asyncio.wait_for(reader.readuntil(b"pong"), 5)
    writer.close()
    date = next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"date:"))
    return parsedate_to_datetime(date.decode().strip()).timestamp()


async def test_an_idle_server_does_not_wake_and_its_date_header_follows_the_clock() -> None:
    server = frontend_server()
    async with started(server) as address:
        for _ in range(2):  # a request 10 ms into a second carries that second (uvicorn's lagged up to 1 s)
            now = time.time()
            await asyncio.sleep(math.floor(now) + 1.01 - now)
            asked = time.time()
            assert await date_of_a_request(address) == math.floor(asked)
        assert server.wakeups == 0  # uvicorn's own loop: ten a second


async def test_should_exit_ends_the_wait_from_any_thread() -> None:
    server = frontend_server()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "uvicorn did not start"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # waiting in the tick
    setter = threading.Thread(target=setattr, args=(server, "should_exit", True))
    setter.start()
    setter.join()
    await asyncio.wait_for(task, 10)  # only the wake can end the wait
    assert server.should_exit
