"""Deferred work without a ticking thread: :class:`Later` runs a batch's work once, some time after it
was first asked for.

The request line and the OTLP processor collect a request's telemetry and write or encode it in
batches. A background thread waking every 0.1 s for that cost a loaded frontend more CPU than the work
it did (each wake takes the GIL from a busy event loop: ~0.2-0.5 ms of CPU per wake on a shared 2-core
box; measured with bench/tracing_overhead.py, the thread of a 10 % sampled frontend, which had almost
nothing to encode, cost as much as the sampled spans). Here the work is a timer on the event loop of
the thread that asks (the server's, the picker's): no thread switch, and nothing at all while idle. A
caller without a running loop gets a helper thread, woken only when there is work.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Later:
    """Runs ``work`` (exceptions logged) once after :meth:`soon`; a call while one is pending does nothing.

    ``stale``: a pending run older than this many seconds is taken as lost (its loop closed before it
    ran) and the next :meth:`soon` schedules another.
    """

    def __init__(self, work: Callable[[], None], name: str, stale: float = 10.0) -> None:
        self._work = work
        self._name = name
        self._stale = stale
        self._at = 0.0  # when the pending run was scheduled (monotonic), 0.0 when none is
        self._wake = threading.Event()
        self._delay = 0.0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def soon(self, delay: float) -> None:
        """Run the work in about ``delay`` seconds, unless a run is already pending."""
        now = time.monotonic()
        if self._at and now - self._at < self._stale:
            return
        self._at = now
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._on_thread(delay)
            return
        loop.call_later(delay, self.run)

    def run(self) -> None:
        """Run the work now (the pending run, or a caller's flush)."""
        self._at = 0.0
        try:
            self._work()
        except Exception:  # a broken stream or exporter: the next batch tries again
            log.exception("%s failed", self._name)

    def _on_thread(self, delay: float) -> None:
        with self._lock:
            if self._stopped:
                return
            self._delay = delay
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            time.sleep(self._delay)
            if self._stopped:
                return
            self.run()

    def stop(self) -> None:
        """No more runs on the helper thread (a caller flushes what is left)."""
        self._stopped = True
        self._wake.set()
