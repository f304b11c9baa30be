"""uvicorn's server without its tick: the Date header is made when a request reads it, and exit wakes the loop.

uvicorn's ``main_loop`` sleeps 0.1 s between ticks (``on_tick``): every tenth tick refreshes the
default headers (``Date``, and ``Server``), and every tick looks at ``should_exit``. On an idle
frontend those ten wakeups a second were most of its CPU (bench/idle_cpu.py). Here the default
headers are a property of the server state, remade the first time they are read in a new second
of the wall clock (uvicorn reads them once per request: a clock read and a compare), so the Date
is the request's second (uvicorn's lagged by up to a second); and the loop sleeps until
``should_exit`` is set (by the SIGTERM/SIGINT handler, or a test, from any thread), which wakes it
at once, so shutdown begins as promptly as before. A config that asks for uvicorn's per-tick
checks (``limit_max_requests``, ``callback_notify``) keeps uvicorn's own loop.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from email.utils import formatdate

import uvicorn
from uvicorn.server import ServerState

MICROSECOND = 1e-6  # formatdate rounds the time to the microsecond: this close to a second, it may show the next


class DatedState(ServerState):
    """uvicorn's server state whose ``default_headers`` carry the Date of the second they are read in."""

    def __init__(self, config: uvicorn.Config, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock
        self._headers: list[tuple[bytes, bytes]] = []
        self._from = self._until = 0.0  # the wall-clock times the headers hold for: [from, until)
        super().__init__()

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        now = self._clock()
        if not self._from <= now < self._until:  # a new second (or the clock was set back)
            config = self._config
            date = [(b"date", formatdate(now, usegmt=True).encode())] if config.date_header else []
            self._headers = date + config.encoded_headers  # as uvicorn's on_tick makes them
            self._from = math.floor(now)
            self._until = self._from + 1.0 - MICROSECOND
        return self._headers

    @default_headers.setter
    def default_headers(self, value: list[tuple[bytes, bytes]]) -> None:
        self._headers = value  # uvicorn's on_tick (at start and exit): the same headers
        self._from = self._until = 0.0  # remade at the next read all the same


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class QuietServer(uvicorn.Server):
    """uvicorn's server with no tick; setting :attr:`should_exit` wakes it."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._waiter: asyncio.Future[None] | None = None
        self._exit = False
        self.wakeups = 0  # times :meth:`main_loop` woke (tests count them)
        super().__init__(config)
        self.server_state = DatedState(config)

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit = value
        waiter = self._waiter
        if value and waiter is not None:
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    async def main_loop(self) -> None:
        if self.config.limit_max_requests is not None or self.config.callback_notify is not None:
            await super().main_loop()
            return
        loop = asyncio.get_running_loop()
        while not await self.on_tick(0):
            waiter = self._waiter = loop.create_future()
            if not self._exit:  # set before the waiter existed: nothing would wake it
                await waiter
            self._waiter = None
            self.wakeups += 1
