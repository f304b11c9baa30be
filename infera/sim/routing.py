"""The one seam between the simulator and the router: every routing decision goes through here.

The simulator does not model the router; it runs it. :class:`SimRouter` builds a real
:class:`infera.router.router.Router` over a fixed fleet (no transport is ever called) and uses its
placement API, the same one the GAIE endpoint picker uses: ``Router.place_now`` runs the context,
candidates and pick (the configured policy, temperature and tie-break) and holds the load tickets
with the routing-time predictions; ``Placement.answered`` at the first token (prefill done, the
blindness rule's "events owed"), ``Placement.release`` at completion. KV event batches reach the
router through the event-source seam (``bind``), as a real transport delivers them, only late.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

from infera.discovery.base import FleetListener
from infera.kv.index import PrefixIndex
from infera.kv.tokenizer import PromptRenderer
from infera.protocols.kv_events import EventBatch
from infera.protocols.worker import Capacity, KvEventEndpoint, WorkerRecord
from infera.router.context import RouteRequest
from infera.router.placement import Placement
from infera.router.router import Router, RouterOptions
from infera.transport.base import EventSink, GapSink, RawSink, ReadySink, SocketSink, StreamSink

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

    def __init__(self) -> None:
        self.sink: Callable[[str, EventBatch], None] | None = None

    def bind(self, sink: EventSink, on_gap: GapSink, raw: RawSink | None = None, socket: SocketSink | None = None,
             stream: StreamSink | None = None, ready: ReadySink | None = None) -> None:
        self.sink = sink  # the simulator hands over decoded batches: no payloads for ``raw``

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def watch(self, worker: WorkerRecord) -> None:
        pass

    def unwatch(self, worker_id: str) -> None:
        pass

    def catch_up(self) -> None:
        pass  # batches are handed over as the simulated engines publish them


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
    placement: Placement


def worker_ids(n: int) -> list[str]:
    width = len(str(n - 1))
    return [f"w{i:0{width}d}" for i in range(n)]


class SimRouter:
    def __init__(self, n_workers: int, block_size: int, policy: str, clock: Callable[[], float],
                 kv_overlap_weight: float = 1.0, temperature: float = 0.0, seed: int = 0,
                 capacity: Capacity | None = None) -> None:
        # ``capacity``: what each record says, as the mock engine's records do live (usable blocks, max sequences)
        records = {
            wid: WorkerRecord(instance_id=wid, model=MODEL, engine="mock", http_url=f"http://{wid}.sim",
                              kv_events=KvEventEndpoint(endpoint=f"sim://{wid}"), kv_block_size=block_size,
                              capacity=capacity.model_copy() if capacity is not None else Capacity())
            for wid in worker_ids(n_workers)
        }
        options = RouterOptions(policy=policy, kv_overlap_weight=kv_overlap_weight, temperature=temperature)
        # The router refuses a tokenizing policy without a renderer; the simulator hands it token ids directly.
        renderer = cast(PromptRenderer, object())
        self._events = _Events()
        self.router = Router(_Fleet(records), cast(Any, _NoTransport()), self._events, renderer, options,
                             index=_VirtualIndex(clock), clock=clock, rng=random.Random(seed))
        self.block_size = block_size
        self._clock = clock

    def route(self, token_ids: list[int], max_tokens: int) -> Routed:
        req = RouteRequest(kind="completion", path="/v1/completions", body=b"", model=MODEL,
                           payload={"prompt": token_ids}, max_tokens=max_tokens)
        placement = self.router.place_now(req)
        return Routed(placement.worker.instance_id, placement.overlap, placement)

    def first_token(self, routed: Routed) -> None:
        routed.placement.answered()

    def finished(self, routed: Routed) -> None:
        routed.placement.release()

    def deliver(self, worker_id: str, batch: EventBatch) -> None:
        assert self._events.sink is not None, "the router binds its event source when it is built"
        self._events.sink(worker_id, batch)

    def decisions(self) -> dict[str, int]:
        return {reason: n for (_, reason), n in self.router.view.stats().decisions.items()}
