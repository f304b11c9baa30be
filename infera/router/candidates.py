"""Candidates: which workers may take a request, before any policy scores them.

Filters, in order: the model, the role (mixed, prefill, decode), the connector (the two
workers of a pair share one), the record's capabilities for the kind of request (a worker
with ``serves_chat`` false takes chat only as a text completion), and health: a worker that
failed before its first byte cools down with exponential backoff (1 s doubling to 30 s)
until it serves again; failures that land while it already cools down (requests sent to it
before the first failure was seen) are the same incident and do not double the backoff.
When every candidate is cooling down, they all count (trying one beats refusing). Workers
are grouped once per fleet change, so the per-request cost does not grow with the fleet;
everything held about a worker goes when it leaves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Literal

from infera.discovery.base import FleetChange, FleetView
from infera.protocols.worker import WorkerRecord
from infera.router.errors import NotServable
from infera.router.topology import Topology, choose, connector_of

Kind = Literal["chat", "completion"]

FIRST_BACKOFF = 1.0  # seconds a worker is avoided after its first failure; doubles per failure
MAX_BACKOFF = 30.0
CHAT_AS_COMPLETION = ("this model is served by disaggregated workers that take KV-transfer parameters only on the "
                      "text-completion path (ATOM): send the request to /v1/completions with the chat template "
                      "applied to the prompt")


def can_take(worker: WorkerRecord, kind: Kind) -> bool:
    """Whether the worker's record says it takes a request of this kind."""
    return kind != "chat" or worker.serves_chat is not False


class Candidates:
    def __init__(self, fleet: FleetView, clock: Callable[[], float] = time.monotonic) -> None:
        self._fleet = fleet
        self._clock = clock
        self._cooldown: dict[str, tuple[float, float]] = {}  # worker -> (until, last backoff)
        # per fleet mapping (fleet views replace it on every change, so its identity says whether these are
        # current; :meth:`_workers` starts them over): the workers grouped, built on first use, and the
        # topologies while no worker cools down (health then filters nothing)
        self._cached_from: object = None
        self._groups: dict[tuple[str, str, Kind], list[WorkerRecord]] | None = None
        self._topologies: dict[tuple[str, Kind], Topology] = {}
        fleet.subscribe(self._on_change)

    def _on_change(self, change: FleetChange) -> None:
        if change.kind == "remove":
            self._cooldown.pop(change.worker.instance_id, None)

    # ---- health -------------------------------------------------------------------------

    def healthy(self, worker_id: str) -> bool:
        return self._cooldown.get(worker_id, (0.0, 0.0))[0] <= self._clock()

    def failed(self, worker_id: str) -> None:
        """The worker failed before its first byte: avoid it for a while, longer each time it fails
        again after a cooldown ran out (one hang seen by 40 requests in flight is one failure)."""
        now = self._clock()
        until, backoff = self._cooldown.get(worker_id, (0.0, FIRST_BACKOFF / 2))
        if until > now:
            return
        backoff = min(backoff * 2, MAX_BACKOFF)
        self._cooldown[worker_id] = (now + backoff, backoff)

    def served(self, worker_id: str) -> None:
        """The worker answered: it is healthy again."""
        if self._cooldown:
            self._cooldown.pop(worker_id, None)

    def cooling_down(self) -> dict[str, float]:
        """Seconds left per worker that is being avoided."""
        now = self._clock()
        return {w: until - now for w, (until, _) in self._cooldown.items() if until > now}

    def holds(self, worker_id: str) -> bool:
        """Whether any state about ``worker_id`` is held (for tests of what leaving releases)."""
        return worker_id in self._cooldown

    # ---- pools --------------------------------------------------------------------------

    def _workers(self) -> Mapping[str, WorkerRecord]:
        """The fleet's mapping; when it is a new one, the caches kept per fleet mapping start over."""
        workers = self._fleet.workers()
        if workers is not self._cached_from:
            self._cached_from = workers
            self._groups = None
            self._topologies = {}
        return workers

    def _group(self, model: str, role: str, kind: Kind) -> list[WorkerRecord]:
        """Workers of ``model`` and ``role`` that take ``kind``, sorted by id, rebuilt only when the fleet changes."""
        workers = self._workers()
        groups = self._groups
        if groups is None:
            groups = self._groups = {}
            for w in sorted(workers.values(), key=lambda w: w.instance_id):
                groups.setdefault((w.model, w.role, "completion"), []).append(w)
                if can_take(w, "chat"):
                    groups.setdefault((w.model, w.role, "chat"), []).append(w)
        return groups.get((model, role, kind), [])

    def pool(self, model: str, role: str, kind: Kind, exclude: Collection[str] = (),
             connector: str | None = None, allowed: Callable[[WorkerRecord], bool] | None = None,
             ) -> list[WorkerRecord]:
        """The workers a policy may choose from (healthy ones first; all of them if none is), within
        ``allowed`` when given (a gateway's endpoint subset)."""
        group = self._group(model, role, kind)
        if not exclude and connector is None and not self._cooldown and allowed is None:
            return group
        eligible = [w for w in group if w.instance_id not in exclude
                    and (connector is None or connector_of(w) == connector) and (allowed is None or allowed(w))]
        healthy = [w for w in eligible if self.healthy(w.instance_id)]
        return healthy or eligible

    def warmable(self, model: str) -> list[WorkerRecord]:
        """Workers that prefill prompts of ``model`` (mixed and prefill; decode workers never do)."""
        group = sorted(self._group(model, "mixed", "completion") + self._group(model, "prefill", "completion"),
                       key=lambda w: w.instance_id)
        return [w for w in group if self.healthy(w.instance_id)] or group

    def topology(self, model: str, kind: Kind) -> Topology:
        """A prefill+decode pair when the fleet has one that takes ``kind``, else a mixed worker.

        Raises :class:`NotServable` when only workers that cannot take ``kind`` serve the model.
        While no worker cools down, the answer depends on the fleet alone: it is computed once per
        fleet change (fleet views replace their mapping on every change).
        """
        if self._cooldown:
            return self._topology(model, kind)
        self._workers()
        topology = self._topologies.get((model, kind))
        if topology is None:
            topology = self._topology(model, kind)
            if topology.kind != "none":  # kept per model served: a stream of unknown names cannot grow it
                self._topologies[(model, kind)] = topology
        return topology

    def _topology(self, model: str, kind: Kind) -> Topology:
        workers = self._fleet.workers().values()
        able = [w for w in workers if can_take(w, kind)]
        topology = choose(able, model, self.healthy)
        if topology.kind == "none" and len(able) < len(workers) and choose(workers, model, self.healthy).kind != "none":
            raise NotServable(CHAT_AS_COMPLETION)
        return topology

    def check(self, worker: WorkerRecord, kind: Kind) -> WorkerRecord:
        """Direct mode: the named worker, or :class:`NotServable` when it cannot take ``kind``."""
        if not can_take(worker, kind):
            raise NotServable(CHAT_AS_COMPLETION)
        return worker
