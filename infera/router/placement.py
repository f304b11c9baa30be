"""A placement: where one request goes (a mixed worker, or a prefill+decode pair), holding its load.

:meth:`Router.place` returns one with a load ticket per worker already held, so the next
decision sees this request's load at once. The holder either sends the request (the
router's own legs, or, for the GAIE endpoint picker, the gateway) and then calls
:meth:`Placement.answered` at the first byte and :meth:`Placement.release` when the response
has ended however it ended, or reports a worker that failed before its first byte with
:meth:`Placement.failed`. A gateway that retried on one of :attr:`Placement.fallbacks` says so
with :meth:`Placement.moved_to`, which moves the load to the worker that really serves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

from infera.kv.load import LoadTracker, Ticket
from infera.protocols.worker import WorkerRecord
from infera.router.base import RoutingContext

Allowed = Callable[[WorkerRecord], bool]  # a subset of the fleet a placement must stay within


@dataclasses.dataclass(eq=False, slots=True)
class Placement:
    kind: Literal["mixed", "pd"]
    worker: WorkerRecord  # the mixed worker, or the decode worker of a pair
    prefill: WorkerRecord | None  # the prefill worker of a pair
    connector: str | None  # the pair's connector
    ctx: RoutingContext
    overlap: int  # prompt blocks cached on the worker that computes the prompt (mixed or prefill)
    tickets: dict[str, Ticket]  # by role: "mixed", or "prefill" and "decode"
    named: frozenset[str]  # roles fixed by direct-mode headers: no other worker may take their place
    room: int  # fresh per placement: a push pair's bootstrap room, 0 <= room < 2**63
    _load: LoadTracker
    _on_failure: Callable[[str, bool], None]
    _on_answer: Callable[[Placement], None]
    _on_move: Callable[[Placement, WorkerRecord], None]
    fallbacks: list[WorkerRecord] = dataclasses.field(default_factory=list)  # least loaded others, in order

    def release(self, role: str | None = None) -> None:
        """End the load ticket(s): one role's, or all of them. Idempotent."""
        end = self._load.end
        if role is None:
            for ticket in self.tickets.values():
                end(ticket)
        elif (held := self.tickets.get(role)) is not None:
            end(held)

    def answered(self) -> None:
        """The worker(s) sent their first byte: the prompt no longer waits for compute (load model), the
        workers are healthy, and one that computed an uncached prompt owes KV events (blindness rule)."""
        prefill_done = self._load.prefill_done
        for ticket in self.tickets.values():
            prefill_done(ticket)
        self._on_answer(self)

    def moved_to(self, worker: WorkerRecord) -> None:
        """The gateway sent the request to ``worker`` (a fallback) instead: the load moves there, and the
        worker it skipped is avoided for a while as if it had failed before its first byte."""
        if worker.instance_id != self.worker.instance_id:
            self._on_move(self, worker)

    def failed(self, worker_id: str, retryable: bool = False) -> None:
        """``worker_id`` failed before its first byte, which ends this attempt: release every ticket
        and, unless ``retryable`` (the worker is healthy and only busy, e.g. it answered 429), avoid
        the worker for a while. Place the request again to try another worker."""
        self.release()
        self._on_failure(worker_id, retryable)

    def workers(self) -> dict[str, WorkerRecord]:
        """The chosen workers by role."""
        if self.prefill is None:
            return {"mixed": self.worker}
        return {"prefill": self.prefill, "decode": self.worker}
