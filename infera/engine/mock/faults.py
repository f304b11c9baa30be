"""Fault knobs of the mock engine, for the reliability suite (``bench.faults``, ``tests/reliability``).

``POST /infera/faults`` takes a JSON object with any of:

- ``slowdown`` (float >= 1): every scheduler step takes this many times its modelled time;
- ``kv_events_paused`` (bool): the KV-event publisher holds its batches (a stalled publisher);
  on resume it sends them in order, so a subscriber sees a late burst, not a gap;
- ``hang`` (bool): the engine stops answering with its sockets open: steps stop (streams stall
  mid-way) and every HTTP request but this one waits until the hang is lifted.

and answers the knobs now in force (``GET /infera/faults`` too). ``GET /infera/requests`` is the
ledger of generation requests seen, by ``x-request-id``: ``{"requests": {id: times}, "total": n}``,
so a test can count duplicated work across engines. The ledger keeps the newest
:data:`LEDGER_SIZE` ids.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

LEDGER_SIZE = 100_000
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate"})
FAULT_PATHS = frozenset({"/infera/faults", "/infera/requests"})


class Faults:
    """The knobs in force; read by the engine's step loop, the publisher and :class:`FaultGate`."""

    def __init__(self) -> None:
        self.slowdown = 1.0
        self.kv_events_paused = False
        self._running = asyncio.Event()
        self._running.set()
        self.ledger: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.total = 0

    @property
    def hang(self) -> bool:
        return not self._running.is_set()

    def set_hang(self, hang: bool) -> None:
        if hang:
            self._running.clear()
        else:
            self._running.set()

    async def wait_running(self) -> None:
        """Return at once unless hung; else when the hang is lifted."""
        if not self._running.is_set():
            await self._running.wait()

    def saw(self, request_id: str) -> None:
        self.total += 1
        self.ledger[request_id] = self.ledger.pop(request_id, 0) + 1
        if len(self.ledger) > LEDGER_SIZE:
            self.ledger.popitem(last=False)

    def state(self) -> dict[str, Any]:
        return {"slowdown": self.slowdown, "kv_events_paused": self.kv_events_paused, "hang": self.hang}

    def apply(self, body: dict[str, Any]) -> None:
        """Set the knobs ``body`` names; ``(message, param)`` as a :class:`ValueError` on a bad value,
        nothing changed then."""
        slowdown = body.get("slowdown", self.slowdown)
        if isinstance(slowdown, bool) or not isinstance(slowdown, int | float) or not 1.0 <= slowdown <= 1000.0:
            raise ValueError("slowdown must be a number from 1 to 1000", "slowdown")
        flags = {name: body.get(name, getattr(self, name)) for name in ("kv_events_paused", "hang")}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false", name)
        unknown = set(body) - {"slowdown", *flags}
        if unknown:
            raise ValueError(f"unknown fault knob(s): {', '.join(sorted(unknown))}", None)
        self.slowdown = float(slowdown)
        self.kv_events_paused = flags["kv_events_paused"]
        self.set_hang(flags["hang"])


class FaultGate:
    """ASGI middleware: records generation requests in the ledger and, while hung, holds every
    request but the fault endpoints' (the connection stays open, no byte is answered)."""

    def __init__(self, app: ASGIApp, faults: Faults) -> None:
        self.app = app
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path in GENERATION_PATHS:
                rid = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
                if rid is not None:
                    self.faults.saw(rid.decode("latin-1"))
            if path not in FAULT_PATHS:
                await self.faults.wait_running()
        await self.app(scope, receive, send)
