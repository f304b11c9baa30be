"""uvicorn's server loop ticking once a second instead of ten times, and woken at once to exit.

uvicorn's ``main_loop`` sleeps 0.1 s between ticks (``on_tick``): every tenth tick refreshes the
``Date`` header, and every tick looks at ``should_exit``. On an idle frontend those ten wakeups a
second were most of its CPU (bench/idle_cpu.py). Here a tick falls just after each whole second of
the wall clock, so the ``Date`` header changes when the second does (uvicorn's lags by up to a
second), and setting ``should_exit`` (the SIGTERM/SIGINT handler, or a test, from any thread) wakes
the loop at once, so shutdown begins as promptly as before. A config that asks for uvicorn's
per-tick checks (``limit_max_requests``, ``callback_notify``) keeps uvicorn's own loop.
"""

from __future__ import annotations

import asyncio
import math
import time

import uvicorn

TICK_LAG_S = 0.002  # a tick falls this long after the second begins (timers may fire a little early)


def until_next_second(now: float) -> float:
    """Seconds from the wall-clock time ``now`` to just past the next whole second, in
    ``(TICK_LAG_S, 1 + TICK_LAG_S]``."""
    return math.floor(now) + 1.0 - now + TICK_LAG_S


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class QuietServer(uvicorn.Server):
    """uvicorn's server with one tick a second; setting :attr:`should_exit` ends the wait."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._waiter: asyncio.Future[None] | None = None
        self._exit = False
        self.ticks = 0  # ticks run by :meth:`main_loop` (tests count them)
        super().__init__(config)

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
        while not await self.on_tick(0):  # counter 0: every tick refreshes the Date header
            self.ticks += 1
            waiter = self._waiter = loop.create_future()
            if not self._exit:  # set before the waiter existed: nothing would wake it
                timer = loop.call_later(until_next_second(time.time()), _wake, waiter)
                try:
                    await waiter
                finally:
                    timer.cancel()
            self._waiter = None
