"""The router's read API for the server's handlers: workers with their load and cache state,
models, statistics, and one worker's cache view. Nothing here changes routing state."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from infera.discovery.base import FleetView
from infera.kv.feed import IndexFeed
from infera.kv.load import LoadTracker
from infera.protocols.worker import WorkerRecord
from infera.router.candidates import Candidates
from infera.router.pick import OVERLAP_BUCKETS, RouterStats

__all__ = ["OVERLAP_BUCKETS", "RouterView", "Stats", "WorkerState"]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerState:
    record: WorkerRecord
    in_flight: int  # requests the router has in flight on it
    kv_blocks_indexed: int  # KV blocks the router believes it holds
    kv_events_stale: bool  # its KV events are missing or stale: its cache is predicted
    cooldown_seconds: float  # seconds it is still avoided after a failure (0 = healthy)


@dataclasses.dataclass(frozen=True, slots=True)
class Stats:
    decisions: Counter[tuple[str, str]]  # (policy, reason) -> routing decisions
    retries: int  # attempts on an alternate worker
    kv_batches: Counter[str]  # worker -> KV-event batches received
    kv_gaps: Counter[str]  # worker -> KV-event batches lost for good
    overlap_buckets: list[int]  # cumulative counts per OVERLAP_BUCKETS bound
    overlap_sum: float
    overlap_count: int


class RouterView:
    def __init__(self, fleet: FleetView, load: LoadTracker, feed: IndexFeed, candidates: Candidates,
                 stats: RouterStats) -> None:
        self._fleet = fleet
        self._load = load
        self._feed = feed
        self._candidates = candidates
        self._stats = stats
        self._models: tuple[object, list[str], frozenset[str]] = (None, [], frozenset())  # (fleet mapping, its models)

    def has_workers(self) -> bool:
        return bool(self._fleet.workers())

    def worker(self, worker_id: str) -> WorkerRecord | None:
        return self._fleet.workers().get(worker_id)

    def records(self) -> dict[str, WorkerRecord]:
        """The fleet's current workers by id (the mapping is never mutated)."""
        return self._fleet.workers()

    def models(self) -> list[str]:
        """The models the fleet serves, sorted (a new list; computed once per fleet change: the handlers ask
        per request, and fleet views replace their mapping on every change)."""
        return list(self._served()[1])

    def serves(self, model: str) -> bool:
        """Whether a worker of the fleet serves ``model`` (a set lookup; the handlers ask per request)."""
        return model in self._served()[2]

    def _served(self) -> tuple[object, list[str], frozenset[str]]:
        workers = self._fleet.workers()
        if self._models[0] is not workers:
            served = frozenset(w.model for w in workers.values())
            self._models = (workers, sorted(served), served)
        return self._models

    def workers(self) -> list[WorkerState]:
        """Every worker with what the router knows of it, sorted by id."""
        cooling = self._candidates.cooling_down()
        index = self._feed.index
        return [WorkerState(record, self._load.in_flight(wid), index.block_count(wid), self._feed.events_stale(wid),
                            max(0.0, cooling.get(wid, 0.0)))
                for wid, record in sorted(self._fleet.workers().items())]

    def cache_view(self, worker_id: str) -> dict[str, Any] | None:
        """The blocks the router believes ``worker_id`` holds (None: no such worker)."""
        if worker_id not in self._fleet.workers():
            return None
        return {"kv_events_stale": self._feed.events_stale(worker_id), **self._feed.index.cache_view(worker_id)}

    def stats(self) -> Stats:
        s = self._stats
        return Stats(s.decisions, s.retries, self._feed.batches, self._feed.gaps, s.overlap_buckets, s.overlap_sum,
                     s.overlap_count)
