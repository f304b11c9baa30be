"""In-flight load per worker, as the router itself has caused it.

Every routed request holds a :class:`Ticket` from dispatch until its response ends, on
every path (finished, failed, cancelled by a client disconnect). The tracker keeps, per
worker: requests in flight, prompt tokens still waiting for prefill, and the KV blocks
that active requests occupy. Blocks are counted once per worker however many active
requests share them, so requests with a common prefix do not look like N times the load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(slots=True)
class _WorkerLoad:
    in_flight: int = 0
    prefill_tokens: int = 0
    tail_blocks: int = 0
    block_refs: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Ticket:
    worker_id: str
    prefill_tokens: int  # uncached prompt tokens the worker must compute
    hashes: Sequence[int]  # the prompt's full-block hashes (router hashes), may be empty
    tail_blocks: int  # blocks beyond ``hashes``: the partial prompt block and expected output
    load: _WorkerLoad
    prefilling: bool = True
    open: bool = True


class LoadTracker:
    def __init__(self) -> None:
        self._load: dict[str, _WorkerLoad] = {}

    def begin(self, worker_id: str, prefill_tokens: int, hashes: Sequence[int], tail_blocks: int) -> Ticket:
        load = self._load.get(worker_id)
        if load is None:
            load = self._load[worker_id] = _WorkerLoad()
        load.in_flight += 1
        load.prefill_tokens += prefill_tokens
        load.tail_blocks += tail_blocks
        refs = load.block_refs
        for h in hashes:
            refs[h] = refs.get(h, 0) + 1
        return Ticket(worker_id, prefill_tokens, hashes, tail_blocks, load)

    def prefill_done(self, ticket: Ticket) -> None:
        """The worker produced its first token: the prompt is no longer waiting for compute."""
        if ticket.open and ticket.prefilling:
            ticket.prefilling = False
            ticket.load.prefill_tokens -= ticket.prefill_tokens

    def end(self, ticket: Ticket) -> None:
        """Release everything the ticket holds. Idempotent."""
        if not ticket.open:
            return
        self.prefill_done(ticket)
        ticket.open = False
        load = ticket.load
        load.in_flight -= 1
        load.tail_blocks -= ticket.tail_blocks
        refs = load.block_refs
        for h in ticket.hashes:
            left = refs[h] - 1
            if left:
                refs[h] = left
            else:
                del refs[h]

    def in_flight(self, worker_id: str) -> int:
        load = self._load.get(worker_id)
        return load.in_flight if load else 0

    def prefill_tokens(self, worker_id: str) -> int:
        load = self._load.get(worker_id)
        return load.prefill_tokens if load else 0

    def active_blocks(self, worker_id: str) -> int:
        """Distinct prompt blocks plus tail blocks held by the worker's active requests."""
        load = self._load.get(worker_id)
        return len(load.block_refs) + load.tail_blocks if load else 0

    def holds(self, worker_id: str) -> bool:
        """Whether any load is recorded for ``worker_id``."""
        return worker_id in self._load

    def forget(self, worker_id: str) -> None:
        """Drop a worker that left the fleet; its open tickets end harmlessly (on the dropped record)."""
        self._load.pop(worker_id, None)
