"""Legs: the transport calls of a placed request, each under its load ticket, up to the first byte.

A mixed placement is one leg; a prefill+decode placement is two, run by
:class:`DisaggRouter` as the pair's connector shapes them. A leg returns once the worker's
first body chunk is in (:meth:`Legs.open`, bounded by the first-byte timeout). A failure
before it becomes :class:`LegFailed` naming the role, so the router retries that pool; the
ticket ends on every failure path and, after success, when the response ends.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Literal

from infera.kv.feed import IndexFeed
from infera.kv.load import LoadTracker, Ticket
from infera.protocols.worker import WorkerRecord
from infera.router.base import RoutingContext
from infera.router.candidates import Candidates
from infera.router.connector import Pair
from infera.router.connectors import CONNECTORS
from infera.router.context import RouteRequest
from infera.router.disagg import DisaggRouter, Leg, LegFailed
from infera.router.errors import NoWorkers
from infera.router.pick import RouterStats
from infera.router.placement import Placement
from infera.router.response import RoutedResponse
from infera.telemetry.record import current
from infera.transport.base import RequestTransport, UpstreamError, UpstreamResponse

Ender = Callable[[], None]  # ends a leg's ticket (and its span) once its upstream is closed

PREDICTION_TTL = 120.0  # seconds a routing decision is remembered as a predicted cache entry


class Legs:
    def __init__(self, transport: RequestTransport, load: LoadTracker, feed: IndexFeed, candidates: Candidates,
                 stats: RouterStats, clock: Callable[[], float] = time.monotonic) -> None:
        self._transport = transport
        self._load = load
        self._stats = stats
        self._clock = clock
        self._feed = feed
        self._candidates = candidates
        self._disagg = DisaggRouter()
        self._hooks = (self._failed, self._answered, self._moved)  # bound once: every placement holds them
        # on the C path the hold below is one call (csrc/hold18.c: its lines and the ones it calls, issue 15's sixteenth
        # round); else, or where a part is not the plain one its C reads, the method
        self.hold: Callable[[WorkerRecord, str, RoutingContext, int], Ticket] = self._hold
        held, predicted, observed = load.hold_parts(), feed.index.predict_parts(), stats.observe_parts()
        one_call = getattr(feed.index.native, "legs_hold", None)
        if held is not None and predicted is not None and observed is not None and one_call is not None:
            self.hold = functools.partial(one_call, (*held, clock, PREDICTION_TTL, *predicted, *observed,
                                                     RoutingContext))

    def _hold(self, worker: WorkerRecord, role: str, ctx: RoutingContext, overlap: int) -> Ticket:
        """Begin the load ticket of one leg and remember the prompt as predicted on the worker.

        ``role`` shapes the ticket: a mixed worker computes the uncached prompt and decodes;
        a prefill worker computes the uncached prompt and samples one token; a decode worker
        receives the prompt's KV (no compute) and decodes.
        """
        wid = worker.instance_id
        size = worker.kv_block_size
        hashes = ctx.hashes(size)  # [] without token ids (not asked of ctx.token_ids: a Python __len__ per request)
        max_tokens = 1 if role == "prefill" else ctx.max_tokens
        prefill_tokens = 0 if role == "decode" else max(0, ctx.prompt_tokens - overlap * size)
        tail_blocks = -(-(ctx.prompt_tokens - len(hashes) * size + max_tokens) // size)
        ticket = self._load.begin(wid, prefill_tokens, hashes, tail_blocks)
        if hashes:
            if role != "decode":
                self._stats.observe_overlap(overlap / len(hashes))
            self._feed.index.predict(wid, hashes, PREDICTION_TTL, self._clock())
        return ticket

    def place(self, kind: Literal["mixed", "pd"], workers: dict[str, WorkerRecord], connector: str | None,
              ctx: RoutingContext, overlap: int, named: frozenset[str], room: int,
              fallbacks: list[WorkerRecord] | None = None) -> Placement:
        """A placement on ``workers`` (by role) with a load ticket held per worker."""
        failed, answered, moved = self._hooks
        if kind == "mixed":  # every request of a mixed fleet: one leg, no loop over the roles
            worker = workers["mixed"]
            return Placement(kind, worker, None, connector, ctx, overlap, {"mixed": self.hold(worker, "mixed", ctx,
                             overlap)}, named, room, self._load, failed, answered, moved,
                             fallbacks if fallbacks is not None else [])
        tickets = {}
        hold = self.hold
        for role, w in workers.items():  # a loop, not a comprehension: no frame of its own per placement
            tickets[role] = hold(w, role, ctx, overlap if role != "decode" else 0)
        return Placement(kind, workers["decode"], workers.get("prefill"), connector, ctx, overlap, tickets, named,
                         room, self._load, failed, answered, moved, fallbacks if fallbacks is not None else [])

    def _answered(self, placement: Placement) -> None:
        if placement.prefill is not None:
            self._served(placement, placement.prefill, "prefill")
            self._served(placement, placement.worker, "decode")
        else:
            self._served(placement, placement.worker, "mixed")

    def _served(self, placement: Placement, worker: WorkerRecord, role: str) -> None:
        """A worker's first byte: it is healthy; one that computed an uncached prompt owes KV events."""
        self._candidates.served(worker.instance_id)
        ticket = placement.tickets[role]
        if role != "decode" and placement.overlap < len(ticket.hashes):
            self._feed.expect_events(worker.instance_id, ticket.started)

    def _moved(self, placement: Placement, worker: WorkerRecord) -> None:
        role = "decode" if placement.prefill is not None else "mixed"
        self._load.end(placement.tickets[role])
        self._candidates.failed(placement.worker.instance_id)
        placement.tickets[role] = self.hold(worker, role, placement.ctx, 0)
        placement.worker = worker

    def _failed(self, worker_id: str, retryable: bool) -> None:
        if not retryable:  # busy (429) is not a fault: no cooldown
            self._candidates.failed(worker_id)

    async def run(self, placement: Placement, req: RouteRequest, headers: Mapping[str, str]) -> RoutedResponse:
        """Send the placed request; raises :class:`LegFailed` for the leg that failed before the first byte."""
        if placement.prefill is None:
            worker = placement.worker
            try:
                upstream, first, end = await self._open(placement, worker, "mixed", req.path, req.body, headers,
                                                        req.started)
            except UpstreamError as exc:
                raise LegFailed("mixed", worker, exc) from exc
            # the response closes the upstream itself, then ends the ticket: one close a request (a Leg's release
            # would close it again)
            return RoutedResponse(worker.instance_id, upstream, first, end)
        connector = CONNECTORS.get(placement.connector or "")
        if connector is None:
            raise NoWorkers(f"no connector {placement.connector!r} (known: {', '.join(sorted(CONNECTORS))})")

        async def open_leg(worker: WorkerRecord, role: str, body: bytes) -> Leg:
            return await self.open(placement, worker, role, req.path, body, headers, req.started)

        pair = Pair(placement.prefill, placement.worker, placement.room)
        return await self._disagg.run(connector, pair, req.payload, open_leg)

    async def open(self, placement: Placement, worker: WorkerRecord, role: str, path: str, body: bytes,
                   headers: Mapping[str, str], started: float | None = None) -> Leg:
        """Send one leg and wait for its first chunk; its ticket ends here on failure, else on release."""
        upstream, first, end = await self._open(placement, worker, role, path, body, headers, started)

        def release() -> None:
            upstream.close()
            end()

        return Leg(worker, upstream, first, release)

    async def _open(self, placement: Placement, worker: WorkerRecord, role: str, path: str, body: bytes,
                    headers: Mapping[str, str], started: float | None) -> tuple[UpstreamResponse, bytes, Ender]:
        """:meth:`open`'s work: the upstream, its first chunk, and what ends the leg's ticket and span once the
        upstream is closed (the caller closes it first)."""
        ticket = placement.tickets[role]
        wid = worker.instance_id
        upstream: UpstreamResponse | None = None
        record = current()
        span = record.leg(role, wid) if record is not None else None
        if record is not None and span is not None:  # the engine's spans continue this leg's
            headers = {**headers, "traceparent": record.traceparent(span)}
        try:
            upstream = await self._transport.send(worker, path, body, headers, started=started)
            # The first body chunk (b"" for an empty body), awaited in this frame (no coroutine of its own on every
            # request's path); the transport bounds the wait (HTTP: the first-byte timeout; NATS: the idle timeout
            # and the request's wall-clock cap). Any failure but an UpstreamError becomes one.
            try:
                first = await anext(upstream.body)
            except StopAsyncIteration:
                first = b""
            except UpstreamError:
                raise
            except Exception as exc:
                raise UpstreamError(f"worker {wid} failed before its first byte: {exc}") from exc
        except BaseException as exc:
            if upstream is not None:
                upstream.close()
            self._load.end(ticket)
            if record is not None:
                record.leg_failed(span, wid, exc)
            raise
        self._load.prefill_done(ticket)
        self._served(placement, worker, role)
        if record is None:
            return upstream, first, functools.partial(self._load.end, ticket)
        record.leg_first_byte(span, wid)

        def end() -> None:
            self._load.end(ticket)
            record.leg_done(span)

        return upstream, first, end
