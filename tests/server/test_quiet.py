"""An idle frontend's server loop wakes once a second, keeps the Date header right, and exits at once."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime

import pytest
from hypothesis import given
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


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_a_tick_falls_just_after_the_next_whole_second(now: float) -> None:
    delay = quiet.until_next_second(now)
    assert quiet.TICK_LAG_S < delay <= 1 + quiet.TICK_LAG_S + 1e-6
    assert math.floor(now + delay) == math.floor(now) + 1
    assert now + delay - (math.floor(now) + 1) <= quiet.TICK_LAG_S + 1e-6  # just after the second begins


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


async def test_an_idle_server_ticks_once_a_second_and_its_date_header_follows_the_clock() -> None:
    server = frontend_server()
    async with started(server) as address:
        ticks0, t0 = server.ticks, time.monotonic()
        for _ in range(2):  # a request 50 ms into a second carries that second (uvicorn's lagged up to 1 s)
            now = time.time()
            await asyncio.sleep(math.floor(now) + 1.05 - now)
            asked = time.time()
            assert await date_of_a_request(address) == math.floor(asked)
        elapsed = time.monotonic() - t0
        assert server.ticks - ticks0 <= elapsed + 2  # uvicorn's own loop: ten a second


async def test_should_exit_ends_the_wait_at_once_from_any_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "until_next_second", lambda now: 3600.0)  # only the wake can end the wait
    server = frontend_server()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started or server.ticks == 0:
        assert not task.done(), "uvicorn did not start"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # waiting in the tick
    setter = threading.Thread(target=setattr, args=(server, "should_exit", True))
    setter.start()
    setter.join()
    await asyncio.wait_for(task, 10)  # not an hour
    assert server.should_exit
