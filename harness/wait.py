"""The one bounded wait: poll a predicate until it holds, or fail saying what did not happen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL = 0.05


class Abort(RuntimeError):
    """Raised by a predicate when its condition can never hold (say, the process exited): stop waiting."""


def _holds(predicate: Callable[[], object]) -> bool:
    try:
        return bool(predicate())
    except Abort:
        raise
    except Exception:  # not yet observable (connection refused, key missing, ...)
        return False


def wait_until(predicate: Callable[[], object], timeout: float, what: str, *,
               detail: Callable[[], str] | None = None) -> float:
    """Poll ``predicate`` until it is true (an exception counts as false); return the seconds it took.

    Raises ``AssertionError("<what> not reached within <timeout>s")`` (plus ``detail()``, e.g. a
    process log) when the bound passes.
    """
    start = time.monotonic()
    while True:
        if _holds(predicate):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            extra = f"\n{detail()}" if detail else ""
            raise AssertionError(f"{what} not reached within {timeout}s{extra}")
        time.sleep(POLL)


async def await_until(predicate: Callable[[], object], timeout: float, what: str) -> float:  # noqa: ASYNC109
    """:func:`wait_until` inside an event loop: the loop keeps running between polls."""
    start = time.monotonic()
    while True:
        if _holds(predicate):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(POLL)
