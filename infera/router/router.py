"""The router: mode -> topology -> policy -> worker(s), with the invariants no policy may break.

It picks the topology (:mod:`infera.router.topology`: a prefill+decode pair when the fleet
has one, else a mixed worker), filters candidates (model, role, connector, health), asks
the policy for costs (the configured policy for mixed and prefill workers, least load for
decode workers), breaks ties fairly, accounts load on every path (a ticket per worker leg
from dispatch until its response ends, however it ends), retries on an alternate worker when
a worker fails before its first response byte (for a pair: the leg that failed, with a
fresh prefill), and keeps the prefix index fed from KV events. The two legs of a pair run
in :mod:`infera.router.disagg`, shaped by the worker's connector (:mod:`infera.router.connectors`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Literal

from infera.discovery.base import FleetChange, FleetView
from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.kv.tokenizer import PromptRenderer
from infera.protocols.kv_events import EventBatch
from infera.protocols.worker import WorkerRecord
from infera.router.base import Candidate, Policy, PolicyDeps, RoutingContext
from infera.router.connector import Pair
from infera.router.connectors import CONNECTORS
from infera.router.disagg import DisaggRouter, Leg, LegFailed
from infera.router.policies import POLICIES
from infera.router.response import RoutedResponse
from infera.router.topology import choose, connector_of
from infera.transport.base import KvEventSource, RequestTransport, UpstreamError, UpstreamResponse

__all__ = ["RouteRequest", "RoutedResponse", "Router", "RouterOptions", "RoutingError"]

log = logging.getLogger(__name__)

OVERLAP_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
DEFAULT_OUTPUT_TOKENS = 256
PREDICTION_TTL = 120.0  # seconds a routing decision is remembered as a predicted cache entry
DECODE_POLICY = "least-load"
PREFILL_HEADER = "x-prefill-instance-id"
ATOM_ENGINES = ("atom",)


class RoutingError(Exception):
    """The request cannot be routed; ``status`` and ``kind`` say how the client should see it."""

    def __init__(self, status: int, message: str, kind: str = "service_unavailable") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclasses.dataclass(slots=True)
class RouteRequest:
    kind: Literal["chat", "completion"]
    path: str  # the engine path to forward to, e.g. /v1/chat/completions
    body: bytes  # forwarded as is
    payload: Mapping[str, Any]  # the parsed body (read for tokenization only)
    model: str
    max_tokens: int | None = None
    worker_hint: str | None = None  # x-worker-instance-id (direct mode; the decode worker of a pair)
    prefill_hint: str | None = None  # x-prefill-instance-id (direct mode; the prefill worker of a pair)
    # time.monotonic() at intake: a transport's whole-request cap counts from here, across retries
    started: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass(frozen=True, slots=True)
class RouterOptions:
    mode: str = "auto"
    policy: str = "kv-aware"
    kv_overlap_weight: float = 1.0
    temperature: float = 0.0
    max_retries: int = 1
    events_stale_seconds: float = 5.0


@dataclasses.dataclass
class RouterStats:
    decisions: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    retries: int = 0
    kv_batches: Counter[str] = dataclasses.field(default_factory=Counter)
    kv_gaps: Counter[str] = dataclasses.field(default_factory=Counter)
    overlap_buckets: list[int] = dataclasses.field(default_factory=lambda: [0] * len(OVERLAP_BUCKETS))
    overlap_sum: float = 0.0
    overlap_count: int = 0

    def observe_overlap(self, fraction: float) -> None:
        for i, bound in enumerate(OVERLAP_BUCKETS):
            if fraction <= bound:
                self.overlap_buckets[i] += 1
        self.overlap_sum += fraction
        self.overlap_count += 1


class Router:
    def __init__(
        self,
        fleet: FleetView,
        transport: RequestTransport,
        events: KvEventSource | None,
        renderer: PromptRenderer | None,
        options: RouterOptions,
        index: PrefixIndex | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet = fleet
        self.transport = transport
        self.events = events
        self.renderer = renderer
        self.options = options
        self.index = index if index is not None else PrefixIndex()
        self.load = LoadTracker(clock)
        self.stats = RouterStats()
        self._clock = clock
        self._rng = random.Random()
        self._cooldown: dict[str, tuple[float, float]] = {}  # worker -> (until, last backoff)
        self._groups: dict[tuple[str, str], list[WorkerRecord]] = {}
        self._grouped_from: object = None
        self._expect_events_since: dict[str, float] = {}
        self._last_event: dict[str, float] = {}
        self._blind_logged: set[str] = set()
        deps = PolicyDeps(self.index, options.kv_overlap_weight, self.is_blind, self.load, clock)
        self.policy: Policy = POLICIES[options.policy](deps)
        self.decode_policy: Policy = POLICIES[DECODE_POLICY](deps)
        self.disagg = DisaggRouter()
        if self.policy.needs_tokens and renderer is None:
            raise ValueError(f"policy {options.policy} needs a tokenizer (--router-tokenizer-path)")
        fleet.subscribe(self._on_fleet_change)
        if events is not None:
            events.bind(self.on_kv_batch, self.on_kv_gap)

    # ---- fleet and KV events ------------------------------------------------------------

    async def start(self) -> None:
        for worker in self.fleet.workers().values():
            self._on_fleet_change(FleetChange("add", worker))

    def _on_fleet_change(self, change: FleetChange) -> None:
        worker = change.worker
        if change.kind == "remove":
            if self.events is not None:
                self.events.unwatch(worker.instance_id)
            self.index.remove_worker(worker.instance_id)
            self._expect_events_since.pop(worker.instance_id, None)
            self._cooldown.pop(worker.instance_id, None)
        elif self.events is not None:
            self.events.watch(worker)

    def on_kv_batch(self, worker_id: str, batch: EventBatch) -> None:
        """Feed one decoded batch of a worker's KV events into the index."""
        self.index.apply(worker_id, batch)
        self.stats.kv_batches[worker_id] += 1
        self._last_event[worker_id] = self._clock()
        self._expect_events_since.pop(worker_id, None)
        if worker_id in self._blind_logged:
            self._blind_logged.discard(worker_id)
            log.info("worker %s: KV events flow again", worker_id)

    def on_kv_gap(self, worker_id: str, lost: int) -> None:
        """Batches were lost for good: the worker's view may miss removals, so drop it."""
        self.stats.kv_gaps[worker_id] += lost
        self.index.remove_worker(worker_id)

    def is_blind(self, worker_id: str) -> bool:
        """True when the router cannot see this worker's cache through events."""
        worker = self.fleet.workers().get(worker_id)
        if worker is None or worker.kv_events is None or self.events is None:
            return True
        since = self._expect_events_since.get(worker_id)
        if since is None or self._clock() - since < self.options.events_stale_seconds:
            return False
        if worker_id not in self._blind_logged:
            self._blind_logged.add(worker_id)
            log.warning("worker %s: no KV events for %.1fs although it served uncached prompts; predicting its "
                        "cache from routing decisions until events return", worker_id, self._clock() - since)
        return True

    def events_stale(self, worker_id: str) -> bool:
        """For metrics: the router follows KV events, and this worker's are missing or stale."""
        return self.events is not None and self.is_blind(worker_id)

    def blind_workers(self) -> list[str]:
        return [w for w in self.fleet.workers() if self.is_blind(w)]

    # ---- routing ------------------------------------------------------------------------

    def models(self) -> list[str]:
        return sorted({w.model for w in self.fleet.workers().values()})

    def _healthy(self, worker_id: str) -> bool:
        return self._cooldown.get(worker_id, (0.0, 0.0))[0] <= self._clock()

    def _group(self, model: str, role: str) -> list[WorkerRecord]:
        """Workers of ``model`` and ``role`` sorted by id, rebuilt only when the fleet changes.

        Fleet views replace their mapping on every change, so its identity says whether the
        grouping is still current: the per-request cost does not grow with the fleet.
        """
        workers = self.fleet.workers()
        if workers is not self._grouped_from:
            groups: dict[tuple[str, str], list[WorkerRecord]] = {}
            for w in sorted(workers.values(), key=lambda w: w.instance_id):
                groups.setdefault((w.model, w.role), []).append(w)
            self._groups = groups
            self._grouped_from = workers
        return self._groups.get((model, role), [])

    def _candidates(self, model: str, exclude: set[str], role: str = "mixed",
                    connector: str | None = None) -> list[WorkerRecord]:
        group = self._group(model, role)
        if not exclude and connector is None and not self._cooldown:
            return group
        eligible = [w for w in group if w.instance_id not in exclude
                    and (connector is None or connector_of(w) == connector)]
        healthy = [w for w in eligible if self._healthy(w.instance_id)]
        return healthy or eligible  # all cooling down: trying one beats refusing

    def _context(self, req: RouteRequest) -> RoutingContext:
        max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_OUTPUT_TOKENS
        token_ids: list[int] | None = None
        if self.policy.needs_tokens and self.renderer is not None:
            token_ids = self._tokenize(req)
        prompt_tokens = len(token_ids) if token_ids is not None else max(1, len(req.body) // 4)
        return RoutingContext(model=req.model, token_ids=token_ids, prompt_tokens=prompt_tokens,
                              max_tokens=max_tokens)

    def _tokenize(self, req: RouteRequest) -> list[int] | None:
        assert self.renderer is not None
        payload = req.payload
        try:
            if req.kind == "chat":
                kwargs = payload.get("chat_template_kwargs") or {}
                return self.renderer.chat_token_ids(list(payload["messages"]), tools=payload.get("tools"), **kwargs)
            prompt = payload.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
                prompt = prompt[0]  # a batch: route by its first prompt
            if isinstance(prompt, list):
                return [int(t) for t in prompt]
            return self.renderer.encode(str(prompt), add_special_tokens=True)
        except Exception as exc:  # a template that rejects the conversation: the engine will say why
            log.debug("could not render the prompt for routing: %s", exc)
            return None

    def _pick(self, ctx: RoutingContext, candidates: list[WorkerRecord],
              policy: Policy | None = None, policy_name: str | None = None) -> tuple[WorkerRecord, str, int]:
        policy = policy or self.policy
        cands = [
            Candidate(w, self.load.in_flight(w.instance_id), self.load.prefill_tokens(w.instance_id),
                      self.load.active_blocks(w.instance_id))
            for w in candidates
        ]
        scores = policy.score(ctx, cands)
        costs = scores.costs
        if self.options.temperature > 0 and len(costs) > 1:
            low = min(costs)
            weights = [math.exp(-(c - low) / self.options.temperature) for c in costs]
            i = self._rng.choices(range(len(costs)), weights=weights)[0]
        else:
            low = min(costs)
            best = [i for i, c in enumerate(costs) if c - low <= 1e-9]
            if len(best) > 1:
                # Ties go to the least busy, then the emptiest cache (distinct prefixes spread
                # instead of piling up), then chance.
                def key(j: int) -> tuple[int, int]:
                    wid = candidates[j].instance_id
                    return cands[j].in_flight, self.index.block_count(wid)

                least = min(key(j) for j in best)
                best = [j for j in best if key(j) == least]
            i = best[0] if len(best) == 1 else self._rng.choice(best)
        overlap = scores.overlap_blocks[i] if scores.overlap_blocks else 0
        self.stats.decisions[(policy_name or self.options.policy, scores.reason)] += 1
        return candidates[i], scores.reason, overlap

    async def dispatch(self, req: RouteRequest, headers: Mapping[str, str]) -> RoutedResponse:
        """Send ``req`` to the best worker (or prefill+decode pair) and return once the first body chunk is in.

        Raises :class:`RoutingError` when no worker can serve it. Never retries after a
        byte has reached the client; every attempt's load is released on every path.
        """
        direct = self.options.mode == "direct"
        fixed = self._named(req.worker_hint, "x-worker-instance-id", req) if direct else None
        fixed_prefill = self._named(req.prefill_hint, PREFILL_HEADER, req) if direct else None
        if fixed_prefill is not None and fixed_prefill.role != "prefill":
            raise RoutingError(400, f"worker {fixed_prefill.instance_id!r} named by {PREFILL_HEADER} is a "
                                    f"{fixed_prefill.role} worker, not a prefill worker", kind="invalid_request_error")
        if fixed is not None and fixed.role == "prefill":
            raise RoutingError(400, f"worker {fixed.instance_id!r} named by x-worker-instance-id is a prefill "
                                    f"worker; name it in {PREFILL_HEADER} (x-worker-instance-id names the decode "
                                    "worker of a pair)", kind="invalid_request_error")
        if fixed is not None and fixed.role == "mixed":
            if fixed_prefill is not None:
                raise RoutingError(400, f"worker {fixed.instance_id!r} is a mixed worker and cannot take a "
                                        f"prefill worker ({PREFILL_HEADER})", kind="invalid_request_error")
            return await self._dispatch_mixed(req, headers, fixed)
        if fixed is not None or fixed_prefill is not None:
            named = fixed or fixed_prefill
            assert named is not None
            if fixed is not None and fixed_prefill is not None and connector_of(fixed) != connector_of(fixed_prefill):
                raise RoutingError(400, f"prefill worker {fixed_prefill.instance_id!r} ({connector_of(fixed_prefill)}) "
                                        f"and decode worker {fixed.instance_id!r} ({connector_of(fixed)}) use "
                                        "different connectors", kind="invalid_request_error")
            return await self._dispatch_pd(req, headers, connector_of(named), fixed_prefill, fixed)
        topology = choose(self.fleet.workers().values(), req.model, self._healthy)
        if topology.kind == "pd":
            assert topology.connector is not None
            return await self._dispatch_pd(req, headers, topology.connector, None, None)
        if topology.kind == "mixed":
            return await self._dispatch_mixed(req, headers, None)
        if not self.fleet.workers():
            raise RoutingError(503, "no workers are available")
        raise RoutingError(503, topology.explain(req.model))

    def _named(self, worker_id: str | None, header: str, req: RouteRequest) -> WorkerRecord | None:
        """The worker a direct-mode header names (None without the header)."""
        if not worker_id:
            return None
        worker = self.fleet.workers().get(worker_id)
        if worker is None:
            raise RoutingError(503, f"worker {worker_id!r} named by {header} is not in the fleet (not registered, "
                                    "not ready, or gone)")
        if worker.model != req.model:
            raise RoutingError(400, f"worker {worker_id!r} serves model {worker.model!r}, not {req.model!r}",
                               kind="invalid_request_error")
        return worker

    async def _dispatch_mixed(self, req: RouteRequest, headers: Mapping[str, str],
                              fixed: WorkerRecord | None) -> RoutedResponse:
        ctx: RoutingContext | None = None
        tried: set[str] = set()
        last_error: UpstreamError | None = None
        attempts = 1 if fixed is not None else 1 + self.options.max_retries
        for attempt in range(attempts):
            if fixed is not None:
                worker, overlap = fixed, 0
                self.stats.decisions[("direct", "header")] += 1
            else:
                candidates = self._candidates(req.model, tried)
                if not candidates:
                    break
                if ctx is None:
                    ctx = self._context(req)
                worker, _, overlap = self._pick(ctx, candidates)
            if attempt:
                self.stats.retries += 1
            tried.add(worker.instance_id)
            try:
                leg = await self._open_leg(worker, "mixed", req, req.body, headers, ctx, overlap)
            except UpstreamError as exc:
                last_error = exc
                self._mark_failed(worker.instance_id)
                log.warning("worker %s failed before its first byte (attempt %d/%d): %s",
                            worker.instance_id, attempt + 1, attempts, exc)
                continue
            return RoutedResponse(worker.instance_id, leg.upstream, leg.first, leg.release)
        if last_error is not None:
            raise RoutingError(last_error.status, str(last_error), kind="upstream_error") from last_error
        raise RoutingError(503, f"no healthy worker serves model {req.model!r}")

    async def _dispatch_pd(self, req: RouteRequest, headers: Mapping[str, str], connector_name: str,
                           fixed_prefill: WorkerRecord | None, fixed_decode: WorkerRecord | None) -> RoutedResponse:
        """A prefill+decode pair: prefill by the policy (KV cost), decode by load; retry the leg that failed."""
        connector = CONNECTORS.get(connector_name)
        if connector is None:
            raise RoutingError(503, f"no connector {connector_name!r} (known: {', '.join(sorted(CONNECTORS))})")
        ctx = self._context(req)
        tried: dict[str, set[str]] = {"prefill": set(), "decode": set()}
        last_error: UpstreamError | None = None
        attempts = 1 + self.options.max_retries
        for attempt in range(attempts):
            prefill, overlap = fixed_prefill, 0
            if prefill is None:
                candidates = self._candidates(req.model, tried["prefill"], "prefill", connector_name)
                if not candidates:
                    break
                prefill, _, overlap = self._pick(ctx, candidates)
            decode = fixed_decode
            if decode is None:
                candidates = self._candidates(req.model, tried["decode"], "decode", connector_name)
                if not candidates:
                    break
                decode, _, _ = self._pick(ctx, candidates, self.decode_policy, DECODE_POLICY)
            if fixed_prefill is not None or fixed_decode is not None:
                self.stats.decisions[("direct", "header")] += 1
            if req.kind == "chat" and (prefill.engine in ATOM_ENGINES or decode.engine in ATOM_ENGINES):
                raise RoutingError(400, "this model is served by disaggregated ATOM workers, which take KV-transfer "
                                        "parameters only on the text-completion path: send the request to "
                                        "/v1/completions with the chat template applied to the prompt",
                                   kind="invalid_request_error")
            if attempt:
                self.stats.retries += 1
            pair = Pair(prefill, decode, self._rng.getrandbits(63))

            async def open_leg(worker: WorkerRecord, role: str, body: bytes, overlap: int = overlap) -> Leg:
                return await self._open_leg(worker, role, req, body, headers, ctx,
                                            overlap if role == "prefill" else 0)

            try:
                return await self.disagg.run(connector, pair, req.payload, open_leg)
            except LegFailed as failed:
                last_error = failed.error
                wid = failed.worker.instance_id
                tried[failed.role].add(wid)
                self._mark_failed(wid)
                log.warning("%s worker %s failed before the first byte (attempt %d/%d): %s",
                            failed.role, wid, attempt + 1, attempts, failed.error)
                if (fixed_prefill if failed.role == "prefill" else fixed_decode) is not None:
                    break  # the header named it: no other worker may take its place
        if last_error is not None:
            raise RoutingError(last_error.status, str(last_error), kind="upstream_error") from last_error
        raise RoutingError(503, f"no healthy prefill+decode pair ({connector_name}) serves model {req.model!r}")

    async def _open_leg(self, worker: WorkerRecord, role: str, req: RouteRequest, body: bytes,
                        headers: Mapping[str, str], ctx: RoutingContext | None, overlap: int) -> Leg:
        """Send one leg to ``worker`` under a load ticket and wait for its first chunk.

        ``role`` shapes the ticket: a mixed worker computes the uncached prompt and decodes;
        a prefill worker computes the uncached prompt and samples one token; a decode worker
        receives the prompt's KV (no compute) and decodes. The ticket ends on every failure
        here and, after success, when the returned leg is released.
        """
        wid = worker.instance_id
        size = worker.kv_block_size
        hashes = ctx.hashes(size) if ctx is not None and ctx.token_ids else []
        prompt_tokens = ctx.prompt_tokens if ctx is not None else max(1, len(req.body) // 4)
        max_tokens = ctx.max_tokens if ctx is not None else DEFAULT_OUTPUT_TOKENS
        if role == "prefill":
            max_tokens = 1
        prefill_tokens = 0 if role == "decode" else max(0, prompt_tokens - overlap * size)
        tail_blocks = -(-(prompt_tokens - len(hashes) * size + max_tokens) // size)
        ticket = self.load.begin(wid, prefill_tokens, hashes, tail_blocks)
        if hashes:
            if role != "decode":
                self.stats.observe_overlap(overlap / len(hashes))
            self.index.predict(wid, hashes, ttl=PREDICTION_TTL, now=self._clock())
        upstream: UpstreamResponse | None = None
        try:
            upstream = await self.transport.send(worker, req.path, body, headers, started=req.started)
            first = await self._first_chunk(upstream, wid)
        except BaseException:
            if upstream is not None:
                upstream.close()
            self.load.end(ticket)
            raise
        self.load.prefill_done(ticket)
        self._cooldown.pop(wid, None)
        if (role != "decode" and overlap < len(hashes) and worker.kv_events is not None
                and wid not in self._expect_events_since):
            self._expect_events_since[wid] = self._clock()
        opened = upstream

        def release() -> None:
            opened.close()
            self.load.end(ticket)

        return Leg(worker, upstream, first, release)

    async def _first_chunk(self, upstream: UpstreamResponse, wid: str) -> bytes:
        # No deadline here: the transport owns it (HTTP: --upstream-first-byte-timeout; NATS: the idle timeout).
        try:
            return await anext(upstream.body)
        except StopAsyncIteration:
            return b""
        except UpstreamError:
            raise
        except Exception as exc:
            raise UpstreamError(f"worker {wid} failed before its first byte: {exc}") from exc

    def _mark_failed(self, worker_id: str) -> None:
        _, backoff = self._cooldown.get(worker_id, (0.0, 0.5))
        backoff = min(backoff * 2, 30.0)
        self._cooldown[worker_id] = (self._clock() + backoff, backoff)

    def cooling_down(self) -> dict[str, float]:
        now = self._clock()
        return {w: until - now for w, (until, _) in self._cooldown.items() if until > now}
