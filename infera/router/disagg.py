"""The DisaggRouter: runs the two legs of a prefill/decode pair as the connector shapes them.

Serial (pull): the prefill leg runs to the end, then the decode leg starts with the prefill
worker's answer. Concurrent (push): both legs start at once; the prefill response is drained
in the background and the decode response is what reaches the client.

A failure before the decode worker's first byte is attributed to one leg
(:class:`LegFailed`) so the router can retry that leg's pool: a prefill leg that fails (or,
concurrently, fails within :data:`PREFILL_GRACE` of a failed decode leg, whose KV transfer
it broke) is the prefill's fault; otherwise the decode's. Every leg is released on every
path: the legs are opened through the router's ``open_leg``, which holds a load ticket per
leg, and this module closes each leg it opened exactly when its response is no longer read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from infera.protocols.worker import WorkerRecord
from infera.router.connector import Connector, Pair
from infera.router.response import RoutedResponse, buffered
from infera.transport.base import UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

PREFILL_GRACE = 1.0  # seconds a failed decode leg waits to see whether the prefill leg failed first


@dataclasses.dataclass(slots=True)
class Leg:
    """One leg's response, its first chunk in hand; ``release`` closes it and ends its ticket (idempotent)."""

    worker: WorkerRecord
    upstream: UpstreamResponse
    first: bytes
    release: Callable[[], None]


LegOpener = Callable[[WorkerRecord, str, bytes], Awaitable[Leg]]
"""``open_leg(worker, role, body)``: send and wait for the first chunk; raises UpstreamError before it."""


class LegFailed(Exception):
    """A leg failed before the client got a byte; ``role`` says which pool to retry."""

    def __init__(self, role: str, worker: WorkerRecord, error: UpstreamError) -> None:
        super().__init__(f"{role} worker {worker.instance_id}: {error}")
        self.role = role
        self.worker = worker
        self.error = error


@dataclasses.dataclass(slots=True)
class _Prefilled:
    status: int
    content_type: str
    data: bytes


class DisaggRouter:
    def __init__(self) -> None:
        self._background: set[asyncio.Future[Any]] = set()

    async def run(self, connector: Connector, pair: Pair, payload: Mapping[str, Any],
                  open_leg: LegOpener) -> RoutedResponse:
        if connector.concurrent:
            return await self._concurrent(connector, pair, payload, open_leg)
        return await self._serial(connector, pair, payload, open_leg)

    @staticmethod
    async def _prefill(pair: Pair, body: bytes, open_leg: LegOpener) -> _Prefilled:
        """The prefill leg, read to the end and released; failures become :class:`LegFailed`."""
        try:
            leg = await open_leg(pair.prefill, "prefill", body)
        except UpstreamError as exc:
            raise LegFailed("prefill", pair.prefill, exc) from exc
        try:
            rest = [chunk async for chunk in leg.upstream.body]
        except UpstreamError as exc:
            raise LegFailed("prefill", pair.prefill, exc) from exc
        finally:
            leg.release()
        return _Prefilled(leg.upstream.status, leg.upstream.content_type, leg.first + b"".join(rest))

    @staticmethod
    async def _decode(pair: Pair, body: bytes, open_leg: LegOpener) -> Leg:
        try:
            return await open_leg(pair.decode, "decode", body)
        except UpstreamError as exc:
            raise LegFailed("decode", pair.decode, exc) from exc

    @staticmethod
    def _relay_prefill_error(pair: Pair, done: _Prefilled) -> RoutedResponse:
        # A 4xx from the prefill worker is about the request itself: the client should see it.
        return buffered(pair.prefill.instance_id, done.status, done.content_type, done.data,
                        prefill_worker_id=pair.prefill.instance_id)

    async def _serial(self, connector: Connector, pair: Pair, payload: Mapping[str, Any],
                      open_leg: LegOpener) -> RoutedResponse:
        done = await self._prefill(pair, orjson.dumps(connector.prefill_body(payload, pair)), open_leg)
        if done.status >= 400:
            return self._relay_prefill_error(pair, done)
        try:
            answer = orjson.loads(done.data)
        except orjson.JSONDecodeError as exc:
            raise LegFailed("prefill", pair.prefill,
                            UpstreamError(f"worker {pair.prefill.instance_id} answered the prefill leg with "
                                          f"no JSON: {exc}")) from exc
        body = orjson.dumps(connector.decode_body(payload, pair, answer if isinstance(answer, dict) else None))
        leg = await self._decode(pair, body, open_leg)
        return RoutedResponse(pair.decode.instance_id, leg.upstream, leg.first, leg.release,
                              prefill_worker_id=pair.prefill.instance_id)

    async def _concurrent(self, connector: Connector, pair: Pair, payload: Mapping[str, Any],
                          open_leg: LegOpener) -> RoutedResponse:
        pbody = orjson.dumps(connector.prefill_body(payload, pair))
        dbody = orjson.dumps(connector.decode_body(payload, pair, None))
        prefill = asyncio.ensure_future(self._prefill(pair, pbody, open_leg))
        decode = asyncio.ensure_future(self._decode(pair, dbody, open_leg))
        handed_over = False
        try:
            await asyncio.wait((prefill, decode), return_when=asyncio.FIRST_COMPLETED)
            if prefill.done() and not decode.done():
                done = prefill.result()  # raises LegFailed: the decode leg is cancelled below
                if done.status >= 400:
                    return self._relay_prefill_error(pair, done)
                await asyncio.wait((decode,))
            if decode.exception() is not None:
                if not prefill.done():
                    await asyncio.wait((prefill,), timeout=PREFILL_GRACE)
                if prefill.done() and not prefill.cancelled() and isinstance(prefill.exception(), LegFailed):
                    prefill.result()  # the broken prefill broke the decode leg's transfer
                decode.result()
            leg = decode.result()
            handed_over = True
        finally:
            if not handed_over:
                await _cancel(decode, prefill)
        if not prefill.done():  # drain it in the background; it ends with the response at the latest
            self._background.add(prefill)
            prefill.add_done_callback(self._finished)
        else:
            self._finished(prefill)

        def finish() -> None:
            leg.release()
            if not prefill.done():
                prefill.cancel()

        return RoutedResponse(pair.decode.instance_id, leg.upstream, leg.first, finish,
                              prefill_worker_id=pair.prefill.instance_id)

    def _finished(self, task: asyncio.Future[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("prefill leg failed after the decode leg started: %s", task.exception())


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    """Cancel legs still running and wait until they released what they hold; a leg already open is closed."""
    for task in tasks:
        if not task.done():
            task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if task.cancelled():
            continue
        if task.exception() is None:
            result = task.result()
            if isinstance(result, Leg):
                result.release()
