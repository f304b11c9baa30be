"""SGLang-style bootstrap rooms for the push connector, simulated over the mock's own HTTP port.

In SGLang the router sends one request to a prefill and a decode worker at once, both
carrying ``bootstrap_host``, ``bootstrap_port`` and a fresh ``bootstrap_room``; the decode
worker registers with the prefill worker's bootstrap server under that room and the prefill
worker pushes the prompt's KV into it once computed. Here the prefill worker keeps one
future per room, resolved when the request's prompt is computed (its one token sampled),
and serves ``GET /infera/bootstrap/<room>`` as a long poll; the decode worker polls it,
then charges the transfer time per block itself. Rooms are kept for ``ttl`` seconds, so
either side may arrive first.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from infera.engine.mock.engine import RequestHandle
from infera.engine.mock.responses import json_response

ROOM_TTL = 120.0  # seconds a room outlives its opening


class RoomFailed(Exception):
    """The prefill side of a room was aborted or failed: no KV will come."""


class BootstrapRooms:
    """A push prefill worker's rooms: ``room -> future of {"prompt_tokens", "blocks"}``."""

    def __init__(self, block_size: int, ttl: float = ROOM_TTL) -> None:
        self._block_size = block_size
        self._ttl = ttl
        self._rooms: dict[int, tuple[float, asyncio.Future[dict[str, int]]]] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    def _room(self, room: int) -> asyncio.Future[dict[str, int]]:
        now = time.monotonic()
        if len(self._rooms) > 64:
            for key in [k for k, (t, _) in self._rooms.items() if now - t > self._ttl]:
                del self._rooms[key]
        entry = self._rooms.get(room)
        if entry is None:
            entry = self._rooms[room] = (now, asyncio.get_running_loop().create_future())
        return entry[1]

    def attach(self, room: int, handle: RequestHandle) -> None:
        """Resolve ``room`` when ``handle``'s prompt is computed (a prefill request is done after one token)."""
        future = self._room(room)
        bs = self._block_size

        def done(_: object) -> None:
            if future.done():
                return
            seq = handle.seq
            if seq.num_emitted > 0:
                future.set_result({"prompt_tokens": seq.prompt_len, "blocks": -(-seq.prompt_len // bs)})
            else:
                future.set_exception(RoomFailed(f"room {room}: the prefill request was aborted"))
                future.exception()  # retrieved: no "never retrieved" warning if nobody polls

        handle.done.add_done_callback(done)

    async def wait(self, room: int, timeout: float) -> dict[str, int]:  # noqa: ASYNC109 (the poll's own deadline)
        return await asyncio.wait_for(asyncio.shield(self._room(room)), timeout)

    def routes(self) -> list[BaseRoute]:
        return [Route("/infera/bootstrap/{room:int}", self._serve, methods=["GET"])]

    async def _serve(self, request: Request) -> Response:
        room = int(request.path_params["room"])
        timeout = float(request.query_params.get("timeout", "30"))
        try:
            info = await self.wait(room, timeout)
        except TimeoutError:
            return json_response({"error": f"room {room}: no prefill within {timeout:g}s"}, 504)
        except RoomFailed as exc:
            return json_response({"error": str(exc)}, 410)
        return json_response({"room": room, **info})


async def fetch_room(host: str, port: int, room: int, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
    """Wait on a prefill worker's bootstrap room; raises ``RoomFailed`` when no KV will come."""
    url = f"http://{host}:{port}/infera/bootstrap/{room}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout + 5)) as session, \
                session.get(url, params={"timeout": str(timeout)}) as resp:
            info = await resp.json(content_type=None)
            if resp.status != 200:
                raise RoomFailed(f"bootstrap {host}:{port} room {room}: {resp.status} {info.get('error')}")
            return dict(info)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise RoomFailed(f"bootstrap {host}:{port} room {room} unreachable: {exc}") from exc
