"""The router: a request's story from its prompt to the first byte of a worker's answer.

``dispatch(req, headers)`` = **place** (context -> candidates -> pick, holding load) ->
**legs** (send, wait for the first byte) -> on a failure before the first byte, place again
on another worker, up to ``max_retries`` times. The parts: :mod:`infera.kv.feed` (KV events
into the index, blindness), :mod:`.candidates` (model, role, connector, capabilities,
cooldown), :mod:`.context` (tokens, hashes), :mod:`.pick` (policy, temperature, ties),
:mod:`.legs` (transport calls under load tickets; pairs via :mod:`.disagg`), :mod:`.direct`
(direct-mode headers), :mod:`.errors` (why not), :mod:`.view` (the handlers' read API).

**Placement API**, for callers that send the request themselves (the GAIE endpoint picker) or
run in virtual time (the simulator: ``place_now``): ``await router.place(req)`` returns a
:class:`Placement` holding a load ticket per chosen worker, which the caller ends as its
docstring says (``answered``, ``release``, ``failed``, ``moved_to``). ``dispatch`` uses the same
``place``. ``router.preview(model, tokens)`` answers "whom would you pick" and records nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from infera.discovery.base import FleetChange, FleetView
from infera.kv.feed import IndexFeed
from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.kv.tokenizer import PromptRenderer
from infera.protocols.worker import WorkerRecord
from infera.router.base import Policy, PolicyDeps, RoutingContext
from infera.router.candidates import Candidates
from infera.router.context import ContextBuilder, RouteRequest
from infera.router.direct import named
from infera.router.disagg import LegFailed
from infera.router.errors import NoWorkers, RoutingError, UpstreamFailed
from infera.router.legs import Legs
from infera.router.pick import Choice, Picker, RouterStats
from infera.router.placement import Allowed, Placement
from infera.router.policies import POLICIES
from infera.router.response import RoutedResponse
from infera.router.view import RouterView
from infera.telemetry.record import RequestRecord, clock_ns, current
from infera.transport.base import KvEventSource, RequestTransport

__all__ = ["Placement", "RouteRequest", "RoutedResponse", "Router", "RouterOptions", "RoutingError"]

log = logging.getLogger(__name__)
DECODE_POLICY = "least-load"  # the decode worker of a pair computes no prompt: its load is what counts
# A prompt of more bytes may be rendered or tokenized in a worker thread (ContextBuilder.prompt_tokens_off_loop):
# a multi-megabyte prompt takes seconds, which on the event loop would stall every other client. Below it
# (~16k tokens, at most a few milliseconds of work) the thread hop would cost more than it saves.
OFF_LOOP_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class RouterOptions:
    mode: str = "auto"
    policy: str = "kv-aware"
    kv_overlap_weight: float = 1.0
    temperature: float = 0.0
    max_retries: int = 1
    events_stale_seconds: float = 5.0


class Router:
    def __init__(self, fleet: FleetView, transport: RequestTransport, events: KvEventSource | None,
                 renderer: PromptRenderer | None, options: RouterOptions, index: PrefixIndex | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self._fleet = fleet
        self._options = options
        self._rng = rng or random.Random()
        self._load = LoadTracker(clock)
        self._stats = RouterStats()
        self._feed = IndexFeed(fleet, events, index if index is not None else PrefixIndex(),
                               options.events_stale_seconds, clock)
        self._candidates = Candidates(fleet, clock)
        deps = PolicyDeps(self._feed.index, options.kv_overlap_weight, self._feed.blind, self._load, clock)
        self._policy = POLICIES[options.policy](deps)
        self._decode_policy = POLICIES[DECODE_POLICY](deps)
        if self._policy.needs_tokens and renderer is None:
            raise ValueError(f"policy {options.policy} needs a tokenizer (--router-tokenizer-path)")
        self._context = ContextBuilder(renderer, self._policy.needs_tokens)
        self._picker = Picker(self._feed.index, self._load, self._stats, options.temperature, self._rng)
        self._legs = Legs(transport, self._load, self._feed, self._candidates, self._stats, clock)
        self.view = RouterView(fleet, self._load, self._feed, self._candidates, self._stats)
        fleet.subscribe(self._on_change)

    async def start(self) -> None:
        await self._feed.start()

    async def stop(self) -> None:
        await self._feed.stop()

    def _on_change(self, change: FleetChange) -> None:
        if change.kind == "remove":  # the feed and the candidates release their own state
            self._load.forget(change.worker.instance_id)

    async def dispatch(self, req: RouteRequest, headers: Mapping[str, str]) -> RoutedResponse:
        """Send ``req`` to the best worker (or pair) and return once the first body chunk is in.

        Raises :class:`RoutingError` when no worker can serve it. Never retries after a byte
        has reached the client; every attempt's load is released on every path.
        """
        tried: dict[str, set[str]] = {"mixed": set(), "prefill": set(), "decode": set()}
        # the usual request is placed synchronously: no coroutine of place()'s to create and await
        placement = await self.place(req) if self._off_loop(req) else self._place(req, tried, None)
        for attempt in range(1 + self._options.max_retries):
            if attempt:
                try:
                    placement = self._place(req, tried, placement)
                except NoWorkers:
                    break
                self._stats.retries += 1
                if (record := current()) is not None:
                    record.retries += 1
            try:
                return await self._legs.run(placement, req, headers)
            except LegFailed as failed:
                error, wid = failed.error, failed.worker.instance_id
                placement.failed(wid, retryable=error.status == 429)
                tried[failed.role].add(wid)
                log.warning("%s worker %s failed before its first byte (attempt %d/%d): %s", failed.role, wid,
                            attempt + 1, 1 + self._options.max_retries, error)
                if failed.role in placement.named:
                    break  # a header named it: no other worker may take its place
            except BaseException:
                placement.release()
                raise
        raise UpstreamFailed(str(error), error.status) from error

    async def place(self, req: RouteRequest, allowed: Allowed | None = None, fallbacks: int = 0) -> Placement:
        """Choose the worker(s) for ``req`` and hold their load; see the module docstring."""
        ctx = None
        if self._off_loop(req):
            record, start = current(), clock_ns()
            ctx = await self._context.build_off_loop(req, OFF_LOOP_BYTES)
            if record is not None:
                record.tokenized(start, ctx.prompt_tokens, ctx.token_ids is not None)
        return self._place(req, {}, None, allowed, fallbacks, ctx)

    def _off_loop(self, req: RouteRequest) -> bool:
        """Whether ``req``'s context is built in a worker thread (a big prompt the policy tokenizes)."""
        return (len(req.body) > OFF_LOOP_BYTES and self._context.tokenizes
                and not (self._options.mode == "direct" and req.worker_hint))

    def place_now(self, req: RouteRequest, allowed: Allowed | None = None, fallbacks: int = 0) -> Placement:
        """:meth:`place` for callers in virtual time (the simulator). ``allowed`` bounds the mixed or decode
        worker to a subset (a gateway's endpoints); ``placement.fallbacks`` lists up to ``fallbacks`` others."""
        return self._place(req, {}, None, allowed, fallbacks)

    def _place(self, req: RouteRequest, tried: Mapping[str, set[str]], previous: Placement | None,
               allowed: Allowed | None = None, fallbacks: int = 0, built: RoutingContext | None = None) -> Placement:
        """``previous``: the placement of the last attempt, whose topology and context a retry keeps;
        ``built``: the request's context, when already built off the event loop."""
        self._feed.tick()
        direct = (named(self._fleet.workers(), req.model, req.worker_hint, req.prefill_hint)
                  if self._options.mode == "direct" else None)
        if direct is not None and direct.mixed:
            assert direct.worker is not None
            self._picker.count_direct()
            if (record := current()) is not None:
                record.picked("mixed", "direct", direct.worker.instance_id, "header", 0, 0.0, 1, clock_ns())
            return self._legs.place("mixed", {"mixed": direct.worker}, None, self._context.estimate(req), 0,
                                    direct.roles(), 0)
        if direct is not None and direct.any:
            kind, connector = "pd", direct.connector
        elif previous is not None:
            kind, connector = previous.kind, previous.connector
        else:
            topology = self._candidates.topology(req.model, req.kind)
            if topology.kind == "none":
                raise NoWorkers(topology.explain(req.model) if self._fleet.workers() else "no workers are available")
            kind, connector = topology.kind, topology.connector
        record = current()
        ctx = previous.ctx if previous is not None else built or self._build_context(req, record)
        if kind == "mixed":
            pool = self._candidates.pool(req.model, "mixed", req.kind, tried.get("mixed", ()), allowed=allowed)
            if not pool:
                raise NoWorkers(f"no healthy worker serves model {req.model!r}" + (" in the subset" if allowed else ""))
            choice = self._pick("mixed", ctx, pool, self._policy, self._options.policy, record)
            # no fallbacks asked (every request of the router's own): no call for an empty list
            others = self._picker.others(choice.worker, pool, fallbacks) if fallbacks else None
            return self._legs.place("mixed", {"mixed": choice.worker}, None, ctx, choice.overlap, frozenset(),
                                    self._rng.getrandbits(63), others)
        fixed = {"prefill": direct.prefill, "decode": direct.worker} if direct is not None else {}
        chosen = {role: self._candidates.check(w, req.kind) for role, w in fixed.items() if w is not None}
        overlap, others = 0, list[WorkerRecord]()
        for role in ("prefill", "decode"):
            if role in chosen:
                continue
            # the prefill worker is reached through the decode worker: a subset bounds the decode pool only
            pool = self._candidates.pool(req.model, role, req.kind, tried.get(role, ()), connector,
                                         allowed if role == "decode" else None)
            if not pool:
                raise NoWorkers(f"no healthy prefill+decode pair ({connector}) serves model {req.model!r}")
            policy, name = (self._policy, self._options.policy) if role == "prefill" else \
                (self._decode_policy, DECODE_POLICY)
            choice = self._pick(role, ctx, pool, policy, name, record)
            chosen[role] = choice.worker
            overlap = choice.overlap if role == "prefill" else overlap
            others = self._picker.others(choice.worker, pool, fallbacks) if role == "decode" else others
        if direct is not None:
            self._picker.count_direct()
        return self._legs.place("pd", chosen, connector, ctx, overlap,
                                direct.roles() if direct is not None else frozenset(), self._rng.getrandbits(63),
                                others)

    def _build_context(self, req: RouteRequest, record: RequestRecord | None) -> RoutingContext:
        if record is None:
            return self._context.build(req)
        start = clock_ns()
        ctx = self._context.build(req)
        record.tokenized(start, ctx.prompt_tokens, ctx.token_ids is not None)
        return ctx

    def _pick(self, role: str, ctx: RoutingContext, pool: list[WorkerRecord], policy: Policy, name: str,
              record: RequestRecord | None) -> Choice:
        if record is None:
            return self._picker.pick(ctx, pool, policy, name)
        start = clock_ns()
        choice = self._picker.pick(ctx, pool, policy, name)
        record.picked(role, name, choice.worker.instance_id, choice.reason, choice.overlap, choice.cost,
                      choice.candidates, start)
        return choice

    def preview(self, model: str, tokens: list[int]) -> WorkerRecord | None:
        """The worker that would compute this prompt now (mixed or prefill), recording nothing."""
        if not (pool := self._candidates.warmable(model)):
            return None
        self._feed.tick()  # the KV batches waiting on their sockets, as a decision sees them
        ctx = RoutingContext(model=model, token_ids=tokens, prompt_tokens=len(tokens), max_tokens=1)
        return self._picker.preview(ctx, pool, self._policy)

    @property
    def can_tokenize(self) -> bool:
        return self._context.renderer is not None

    def tokens(self, kind: Literal["chat", "completion"], payload: Mapping[str, Any]) -> list[int]:
        """The prompt's token ids as the engine will see them (raises what the chat template raises)."""
        return self._context.prompt_tokens(kind, payload)

    async def tokens_off_loop(self, kind: Literal["chat", "completion"], payload: Mapping[str, Any],
                              size: int) -> list[int]:
        """:meth:`tokens`, its expensive part in a worker thread when the request's body is over
        ``OFF_LOOP_BYTES`` (``size``)."""
        return await self._context.prompt_tokens_off_loop(kind, payload, size, OFF_LOOP_BYTES)
