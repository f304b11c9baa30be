"""Every use the picker makes of the router: its placement API, and the load the gateway's response
moves.

The picker answers the gateway with an endpoint; the gateway (Envoy) sends the request. So the
picker places a request without sending it (:meth:`infera.router.router.Router.place`: topology,
candidates, policy, tie-break, load tickets, predicted cache entries, within the proxy's endpoint
subset) and, as the response goes by, reports what the router's own legs would: the first byte, a
5xx, a fallback pod that served instead, and the end.
"""

from __future__ import annotations

from collections.abc import Callable

from infera.protocols.worker import WorkerRecord
from infera.router.errors import BadDirectHeaders, NotServable, RoutingError, UpstreamFailed
from infera.router.placement import Placement as RouterPlacement
from infera.router.router import Router, RouteRequest

__all__ = ["Placement", "Placer", "RoutingError", "status_of"]

Allowed = Callable[[WorkerRecord], bool]


def status_of(exc: RoutingError) -> int:
    """The HTTP status the gateway answers for a routing failure (as the frontend maps it)."""
    if isinstance(exc, UpstreamFailed):
        return exc.status
    if isinstance(exc, BadDirectHeaders | NotServable):
        return 400
    return 503  # no worker can take it now


class Placement:
    """Where one request goes: ``worker`` (the decode worker of a pair) and, for a pair, ``prefill``."""

    def __init__(self, placed: RouterPlacement) -> None:
        self._placed = placed
        self._answered = False

    @property
    def worker(self) -> WorkerRecord:
        return self._placed.worker

    @property
    def prefill(self) -> WorkerRecord | None:
        return self._placed.prefill

    @property
    def fallbacks(self) -> list[WorkerRecord]:
        return self._placed.fallbacks

    def served_by(self, worker: WorkerRecord) -> None:
        """The proxy fell back to ``worker``: the load moves there, the skipped worker cools down."""
        self._placed.moved_to(worker)

    def first_byte(self) -> None:
        """The response started: prompts are computed, the workers answered (once)."""
        if not self._answered:
            self._answered = True
            self._placed.answered()

    def failed(self) -> None:
        """The worker answered with a server error: cooled down like a failed leg, its load released."""
        self._placed.failed(self._placed.worker.instance_id)

    def release(self) -> None:
        """The response ended, however it ended (idempotent)."""
        self._placed.release()


class Placer:
    def __init__(self, router: Router) -> None:
        self.router = router

    def in_flight(self) -> int:
        return sum(w.in_flight for w in self.router.view.workers())

    def workers(self) -> dict[str, WorkerRecord]:
        return dict(self.router.view.records())

    def least_loaded(self, allowed: Allowed | None) -> list[WorkerRecord]:
        """The fleet's workers (within ``allowed``), least in flight first: for requests with no prompt."""
        states = [w for w in self.router.view.workers() if allowed is None or allowed(w.record)]
        return [w.record for w in sorted(states, key=lambda w: (w.in_flight, w.record.instance_id))]

    def place(self, req: RouteRequest, allowed: Allowed | None = None, fallbacks: int = 0) -> Placement:
        """Pick for ``req`` among the workers ``allowed`` admits; raises :class:`RoutingError` if none can."""
        return Placement(self.router.place_now(req, allowed, fallbacks))
