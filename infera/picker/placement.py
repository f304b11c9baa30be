"""Every use the picker makes of the router: place a request on a worker (or a prefill+decode pair)
without sending it, and hold its load until the proxy says the response ended.

The picker answers the gateway with an endpoint; the gateway (Envoy) sends the request. So a
placement does what ``Router.dispatch`` does up to the transport call -- topology, candidates,
policy, tie-break, load tickets, predicted cache entries -- and the picker calls
:meth:`Placement.first_byte`, :meth:`Placement.failed` and :meth:`Placement.release` as the
response goes by, which is what the router does around its own transport call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from infera.kv.load import Ticket
from infera.protocols.worker import WorkerRecord
from infera.router.base import RoutingContext
from infera.router.router import (
    DECODE_POLICY,
    DEFAULT_OUTPUT_TOKENS,
    PREDICTION_TTL,
    Router,
    RouteRequest,
    RoutingError,
)
from infera.router.topology import choose

__all__ = ["Placement", "Placer", "RoutingError"]

Allowed = Callable[[WorkerRecord], bool]


@dataclasses.dataclass
class Placement:
    """Where one request goes: ``worker`` (the decode worker of a pair) and, for a pair, ``prefill``."""

    worker: WorkerRecord
    prefill: WorkerRecord | None
    fallbacks: list[WorkerRecord]
    _placer: Placer
    _ctx: RoutingContext | None
    _req: RouteRequest
    _overlap: int
    _tickets: list[Ticket] = dataclasses.field(default_factory=list)
    _started: bool = False

    @property
    def open(self) -> bool:
        return any(t.open for t in self._tickets)

    def served_by(self, worker: WorkerRecord) -> None:
        """The proxy fell back to ``worker``: move the mixed/decode ticket there."""
        if worker.instance_id == self.worker.instance_id or not self._tickets:
            return
        placer = self._placer
        placer.router.load.end(self._tickets.pop())
        placer.router._mark_failed(self.worker.instance_id)
        self.worker = worker
        role = "decode" if self.prefill is not None else "mixed"
        self._tickets.append(placer.ticket(worker, role, self._req, self._ctx, 0))

    def first_byte(self) -> None:
        """The response started: prompts are computed, the workers answered."""
        if self._started:
            return
        self._started = True
        router = self._placer.router
        for ticket in self._tickets:
            router.load.prefill_done(ticket)
            router._cooldown.pop(ticket.worker_id, None)
        first = self.prefill or self.worker
        hashes = self._ctx.hashes(first.kv_block_size) if self._ctx is not None and self._ctx.token_ids else []
        wid = first.instance_id
        if (self._overlap < len(hashes) and first.kv_events is not None
                and wid not in router._expect_events_since):
            router._expect_events_since[wid] = router._clock()

    def failed(self) -> None:
        """The workers answered with a server error: cool them down like a failed leg."""
        for ticket in self._tickets:
            self._placer.router._mark_failed(ticket.worker_id)

    def release(self) -> None:
        """The response ended, however it ended (idempotent)."""
        for ticket in self._tickets:
            self._placer.router.load.end(ticket)


class Placer:
    def __init__(self, router: Router) -> None:
        self.router = router

    def in_flight(self) -> int:
        return sum(self.router.load.in_flight(w) for w in self.router.fleet.workers())

    def workers(self) -> dict[str, WorkerRecord]:
        return dict(self.router.fleet.workers())

    def place(self, req: RouteRequest, allowed: Allowed | None = None, fallbacks: int = 0) -> Placement:
        """Pick for ``req`` among the workers ``allowed`` admits; raises :class:`RoutingError` (503) if none."""
        router = self.router
        workers = [w for w in router.fleet.workers().values() if allowed is None or allowed(w)]
        topology = choose(workers, req.model, router._healthy)
        if topology.kind == "pd":
            assert topology.connector is not None
            return self._place_pd(req, topology.connector, allowed, fallbacks)
        if topology.kind == "mixed":
            return self._place_mixed(req, allowed, fallbacks)
        if not workers:
            raise RoutingError(503, "no workers are available" if allowed is None
                               else "no worker of the proxy's endpoint subset is available")
        raise RoutingError(503, topology.explain(req.model))

    def _cands(self, model: str, role: str, allowed: Allowed | None, connector: str | None = None
               ) -> list[WorkerRecord]:
        cands = self.router._candidates(model, set(), role, connector)
        return cands if allowed is None else [w for w in cands if allowed(w)]

    def _others(self, chosen: WorkerRecord, cands: list[WorkerRecord], n: int) -> list[WorkerRecord]:
        """Fallbacks: the least loaded of the other candidates."""
        load = self.router.load
        rest = [w for w in cands if w.instance_id != chosen.instance_id]
        rest.sort(key=lambda w: (load.in_flight(w.instance_id), w.instance_id))
        return rest[:n]

    def _place_mixed(self, req: RouteRequest, allowed: Allowed | None, fallbacks: int) -> Placement:
        cands = self._cands(req.model, "mixed", allowed)
        if not cands:
            raise RoutingError(503, f"no healthy worker serves model {req.model!r}")
        ctx = self.router._context(req)
        worker, _, overlap = self.router._pick(ctx, cands)
        placement = Placement(worker, None, self._others(worker, cands, fallbacks), self, ctx, req, overlap)
        placement._tickets.append(self.ticket(worker, "mixed", req, ctx, overlap))
        return placement

    def _place_pd(self, req: RouteRequest, connector: str, allowed: Allowed | None, fallbacks: int) -> Placement:
        router = self.router
        ctx = router._context(req)
        # The prefill worker is reached through the decode worker's sidecar: the subset bounds decode only.
        prefills = self._cands(req.model, "prefill", None, connector)
        decodes = self._cands(req.model, "decode", allowed, connector)
        if not prefills or not decodes:
            raise RoutingError(503, f"no healthy prefill+decode pair ({connector}) serves model {req.model!r}")
        prefill, _, overlap = router._pick(ctx, prefills)
        decode, _, _ = router._pick(ctx, decodes, router.decode_policy, DECODE_POLICY)
        placement = Placement(decode, prefill, self._others(decode, decodes, fallbacks), self, ctx, req, overlap)
        placement._tickets.append(self.ticket(prefill, "prefill", req, ctx, overlap))
        placement._tickets.append(self.ticket(decode, "decode", req, ctx, 0))
        return placement

    def ticket(self, worker: WorkerRecord, role: str, req: RouteRequest, ctx: RoutingContext | None,
               overlap: int) -> Ticket:
        """The load ``role`` puts on ``worker`` (as the router's legs count it) and its predicted cache."""
        router = self.router
        wid = worker.instance_id
        size = worker.kv_block_size
        hashes = ctx.hashes(size) if ctx is not None and ctx.token_ids else []
        prompt_tokens = ctx.prompt_tokens if ctx is not None else max(1, len(req.body) // 4)
        max_tokens = 1 if role == "prefill" else (ctx.max_tokens if ctx is not None else DEFAULT_OUTPUT_TOKENS)
        prefill_tokens = 0 if role == "decode" else max(0, prompt_tokens - overlap * size)
        tail_blocks = -(-(prompt_tokens - len(hashes) * size + max_tokens) // size)
        ticket = router.load.begin(wid, prefill_tokens, hashes, tail_blocks)
        if hashes:
            if role != "decode":
                router.stats.observe_overlap(overlap / len(hashes))
            router.index.predict(wid, hashes, ttl=PREDICTION_TTL, now=router._clock())
        return ticket
