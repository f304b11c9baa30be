"""The router: mode -> policy -> worker, with the invariants no policy may break.

It filters candidates (model, role, health), asks the policy for costs, breaks ties
fairly, accounts load on every path (a ticket from dispatch until the response ends,
however it ends), retries on an alternate worker when a worker fails before its first
response byte, and keeps the prefix index fed from KV events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

from infera.discovery.base import FleetChange, FleetView
from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.kv.tokenizer import PromptRenderer
from infera.protocols.kv_events import EventBatch
from infera.protocols.worker import WorkerRecord
from infera.router.base import Candidate, Policy, PolicyDeps, RoutingContext
from infera.router.policies import POLICIES
from infera.transport.base import KvEventSource, RequestTransport, UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

OVERLAP_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
DEFAULT_OUTPUT_TOKENS = 256
PREDICTION_TTL = 120.0  # seconds a routing decision is remembered as a predicted cache entry


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
    worker_hint: str | None = None  # x-worker-instance-id (direct mode)


@dataclasses.dataclass(frozen=True, slots=True)
class RouterOptions:
    mode: str = "auto"
    policy: str = "kv-aware"
    kv_overlap_weight: float = 1.0
    temperature: float = 0.0
    max_retries: int = 1
    first_byte_timeout: float = 600.0
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


class RoutedResponse:
    """A worker's response with its first body chunk already in hand.

    Iterate :meth:`chunks` exactly once; the ticket is released and the upstream closed
    when iteration ends, fails or is abandoned (client disconnect).
    """

    def __init__(self, worker_id: str, upstream: UpstreamResponse, first: bytes, finish: Callable[[], None]) -> None:
        self.worker_id = worker_id
        self.status = upstream.status
        self.content_type = upstream.content_type
        self._upstream = upstream
        self._first = first
        self._finish = finish

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            if self._first:
                yield self._first
            async for chunk in self._upstream.body:
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        self._upstream.close()
        self._finish()


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
        self.load = LoadTracker()
        self.stats = RouterStats()
        self._clock = clock
        self._rng = random.Random()
        self._cooldown: dict[str, tuple[float, float]] = {}  # worker -> (until, last backoff)
        self._expect_events_since: dict[str, float] = {}
        self._last_event: dict[str, float] = {}
        self._blind_logged: set[str] = set()
        factory = POLICIES[options.policy]
        self.policy: Policy = factory(PolicyDeps(self.index, options.kv_overlap_weight, self.is_blind))
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

    def blind_workers(self) -> list[str]:
        return [w for w in self.fleet.workers() if self.is_blind(w)]

    # ---- routing ------------------------------------------------------------------------

    def models(self) -> list[str]:
        return sorted({w.model for w in self.fleet.workers().values()})

    def _candidates(self, model: str, exclude: set[str]) -> list[WorkerRecord]:
        now = self._clock()
        eligible = [
            w for w in self.fleet.workers().values()
            if w.model == model and w.role == "mixed" and w.instance_id not in exclude
        ]
        healthy = [w for w in eligible if self._cooldown.get(w.instance_id, (0.0, 0.0))[0] <= now]
        pool = healthy or eligible  # all cooling down: trying one beats refusing
        return sorted(pool, key=lambda w: w.instance_id)

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

    def _pick(self, ctx: RoutingContext, candidates: list[WorkerRecord]) -> tuple[WorkerRecord, str, int]:
        cands = [
            Candidate(w, self.load.in_flight(w.instance_id), self.load.prefill_tokens(w.instance_id),
                      self.load.active_blocks(w.instance_id))
            for w in candidates
        ]
        scores = self.policy.score(ctx, cands)
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
        self.stats.decisions[(self.options.policy, scores.reason)] += 1
        return candidates[i], scores.reason, overlap

    async def dispatch(self, req: RouteRequest, headers: Mapping[str, str]) -> RoutedResponse:
        """Send ``req`` to the best worker and return once its first body chunk is in.

        Raises :class:`RoutingError` when no worker can serve it. Never retries after a
        byte has reached the client; every attempt's load is released on every path.
        """
        fixed: WorkerRecord | None = None
        if self.options.mode == "direct" and req.worker_hint:
            fixed = self.fleet.workers().get(req.worker_hint)
            if fixed is None:
                raise RoutingError(503, f"worker {req.worker_hint!r} named by x-worker-instance-id is not in "
                                        "the fleet (not registered, not ready, or gone)")
            if fixed.model != req.model:
                raise RoutingError(400, f"worker {req.worker_hint!r} serves model {fixed.model!r}, not "
                                        f"{req.model!r}", kind="invalid_request_error")
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
                return await self._attempt(worker, req, ctx, overlap, headers)
            except UpstreamError as exc:
                last_error = exc
                self._mark_failed(worker.instance_id)
                log.warning("worker %s failed before its first byte (attempt %d/%d): %s",
                            worker.instance_id, attempt + 1, attempts, exc)
        if last_error is not None:
            raise RoutingError(last_error.status, str(last_error), kind="upstream_error") from last_error
        if not self.fleet.workers():
            raise RoutingError(503, "no workers are available")
        raise RoutingError(503, f"no healthy worker serves model {req.model!r}")

    async def _attempt(self, worker: WorkerRecord, req: RouteRequest, ctx: RoutingContext | None, overlap: int,
                       headers: Mapping[str, str]) -> RoutedResponse:
        wid = worker.instance_id
        size = worker.kv_block_size
        hashes = ctx.hashes(size) if ctx is not None and ctx.token_ids else []
        prompt_tokens = ctx.prompt_tokens if ctx is not None else max(1, len(req.body) // 4)
        max_tokens = ctx.max_tokens if ctx is not None else DEFAULT_OUTPUT_TOKENS
        tail_blocks = -(-(prompt_tokens - len(hashes) * size + max_tokens) // size)
        ticket = self.load.begin(wid, max(0, prompt_tokens - overlap * size), hashes, tail_blocks)
        if hashes:
            fraction = overlap / len(hashes)
            self.stats.observe_overlap(fraction)
            self.index.predict(wid, hashes, ttl=PREDICTION_TTL, now=self._clock())
        upstream: UpstreamResponse | None = None
        try:
            upstream = await self.transport.send(worker, req.path, req.body, headers)
            first = await self._first_chunk(upstream, wid)
        except BaseException:
            if upstream is not None:
                upstream.close()
            self.load.end(ticket)
            raise
        self.load.prefill_done(ticket)
        self._cooldown.pop(wid, None)
        if overlap < len(hashes) and worker.kv_events is not None and wid not in self._expect_events_since:
            self._expect_events_since[wid] = self._clock()
        return RoutedResponse(wid, upstream, first, lambda: self.load.end(ticket))

    async def _first_chunk(self, upstream: UpstreamResponse, wid: str) -> bytes:
        timeout = self.options.first_byte_timeout or None
        try:
            return await asyncio.wait_for(anext(upstream.body), timeout)
        except StopAsyncIteration:
            return b""
        except TimeoutError as exc:
            raise UpstreamError(f"worker {wid} sent no first byte within {timeout:g}s", status=504) from exc
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
