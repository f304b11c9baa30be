"""The one seam between the simulator and the router: every routing decision goes through here.

The simulator does not model the router; it runs it. :class:`SimRouter` builds a real
:class:`infera.router.router.Router` over a fixed fleet (no transport is ever called) and:

- picks with ``Router._candidates`` + ``Router._pick``: the configured policy's scores, the
  temperature and the server's tie-break (least in flight, then emptiest cache, then chance);
- holds load tickets on ``Router.load`` (the same :class:`infera.kv.load.LoadTracker`) shaped as
  ``Router._open_leg`` shapes a mixed leg: begin at routing with the uncached prompt tokens, the
  prompt's block hashes and the tail blocks, ``prefill_done`` at the first token, ``end`` at
  completion; plus the routing-time prediction in the index (``PREDICTION_TTL``);
- feeds KV event batches through ``Router.on_kv_batch`` (the server's feed into the index), and
  marks a worker as expecting events after an uncached first token, as ``_open_leg`` does (the
  router's blindness rule: no events for ``events_stale_seconds`` after that -> predicted cache).

When the router is split into router/{candidates,context,pick,legs}.py, re-point the three
calls marked SEAM below at the new modules; nothing else in infera.sim touches the router.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

from infera.discovery.base import FleetListener
from infera.kv.index import PrefixIndex
from infera.kv.load import Ticket
from infera.kv.tokenizer import PromptRenderer
from infera.protocols.kv_events import EventBatch
from infera.protocols.worker import KvEventEndpoint, WorkerRecord
from infera.router.base import RoutingContext
from infera.router.router import PREDICTION_TTL, Router, RouterOptions

MODEL = "sim"


class _Fleet:
    """A fixed fleet: the mapping never changes, so the router groups it once."""

    def __init__(self, workers: dict[str, WorkerRecord]) -> None:
        self._workers = workers

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def workers(self) -> dict[str, WorkerRecord]:
        return self._workers

    def subscribe(self, listener: FleetListener) -> None:
        pass


class _Events:
    """Stands for the KV-event transport: the simulator delivers batches itself, late."""

    def bind(self, sink: Any, on_gap: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def watch(self, worker: WorkerRecord) -> None:
        pass

    def unwatch(self, worker_id: str) -> None:
        pass


class _VirtualIndex(PrefixIndex):
    """The router's index, with predictions expiring on the simulator's clock.

    Policies query without a clock (the index then reads ``time.monotonic()``); predictions are
    stamped with the router's clock, which here is virtual, so the default must be virtual too.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self._virtual_clock = clock

    def overlaps(self, hashes: Sequence[int], now: float | None = None,
                 use_predicted: bool | Collection[str] = False) -> dict[str, int]:
        return super().overlaps(hashes, self._virtual_clock() if now is None else now, use_predicted)


class _NoTransport:
    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the simulator never sends a request over a transport")


@dataclasses.dataclass(slots=True)
class Routed:
    worker_id: str
    overlap_blocks: int  # the router's view of the cached prefix on that worker, in blocks
    reason: str
    ticket: Ticket


def worker_ids(n: int) -> list[str]:
    width = len(str(n - 1))
    return [f"w{i:0{width}d}" for i in range(n)]


class SimRouter:
    def __init__(self, n_workers: int, block_size: int, policy: str, clock: Callable[[], float],
                 kv_overlap_weight: float = 1.0, temperature: float = 0.0, seed: int = 0) -> None:
        records = {
            wid: WorkerRecord(instance_id=wid, model=MODEL, engine="mock", http_url=f"http://{wid}.sim",
                              kv_events=KvEventEndpoint(endpoint=f"sim://{wid}"), kv_block_size=block_size)
            for wid in worker_ids(n_workers)
        }
        options = RouterOptions(policy=policy, kv_overlap_weight=kv_overlap_weight, temperature=temperature)
        # The router refuses a tokenizing policy without a renderer; the simulator hands it token ids directly.
        renderer = cast(PromptRenderer, object())
        self.router = Router(_Fleet(records), cast(Any, _NoTransport()), cast(Any, _Events()), renderer, options,
                             index=_VirtualIndex(clock), clock=clock)
        self.router._rng.seed(seed)
        self.block_size = block_size
        self._clock = clock

    def route(self, token_ids: list[int], max_tokens: int) -> Routed:
        router = self.router
        ctx = RoutingContext(model=MODEL, token_ids=token_ids, prompt_tokens=len(token_ids), max_tokens=max_tokens)
        candidates = router._candidates(MODEL, set())  # SEAM: candidates
        worker, reason, overlap = router._pick(ctx, candidates)  # SEAM: pick (policy, temperature, tie-break)
        wid = worker.instance_id
        size = worker.kv_block_size
        # SEAM: legs. As Router._open_leg does for a mixed leg.
        hashes = ctx.hashes(size)
        prefill_tokens = max(0, len(token_ids) - overlap * size)
        tail_blocks = -(-(len(token_ids) - len(hashes) * size + max_tokens) // size)
        ticket = router.load.begin(wid, prefill_tokens, hashes, tail_blocks)
        if hashes:
            router.stats.observe_overlap(overlap / len(hashes))
            router.index.predict(wid, hashes, ttl=PREDICTION_TTL, now=self._clock())
        return Routed(wid, overlap, reason, ticket)

    def first_token(self, routed: Routed) -> None:
        router = self.router
        router.load.prefill_done(routed.ticket)
        wid = routed.worker_id
        # As Router._open_leg after the first chunk: an uncached prompt must bring events soon,
        # or the worker counts as blind (its cache then predicted from routing decisions).
        if routed.overlap_blocks < len(routed.ticket.hashes) and wid not in router._expect_events_since:
            router._expect_events_since[wid] = self._clock()

    def finished(self, routed: Routed) -> None:
        self.router.load.end(routed.ticket)

    def deliver(self, worker_id: str, batch: EventBatch) -> None:
        self.router.on_kv_batch(worker_id, batch)

    def decisions(self) -> dict[str, int]:
        return {reason: n for (_, reason), n in self.router.stats.decisions.items()}
