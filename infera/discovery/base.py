"""The fleet-view seam: which workers exist right now, and what changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal, Protocol

from infera.protocols.worker import WorkerRecord


@dataclasses.dataclass(frozen=True, slots=True)
class FleetChange:
    kind: Literal["add", "update", "remove"]
    worker: WorkerRecord


FleetListener = Callable[[FleetChange], None]


class FleetView(Protocol):
    """A live set of routable workers (listed, reachable, and in a state to serve)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def workers(self) -> dict[str, WorkerRecord]:
        """The current workers by instance id. Cheap; called on every request."""
        ...

    def subscribe(self, listener: FleetListener) -> None:
        """Call ``listener`` for every change from now on (synchronously, in the event loop)."""
        ...


class Registrar(Protocol):
    """Worker side: publish this worker's record and keep it published.

    ``register`` publishes (and keeps alive, re-publishing after a lost lease or a restarted
    store) until ``deregister``, which removes the record so routers stop sending first.
    """

    async def register(self, record: WorkerRecord) -> None: ...

    async def update(self, record: WorkerRecord) -> None: ...

    async def deregister(self) -> None: ...
