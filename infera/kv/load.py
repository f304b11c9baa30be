"""In-flight load per worker, as the router itself has caused it.

Every routed request holds a :class:`Ticket` from dispatch until its response ends, on
every path (finished, failed, cancelled by a client disconnect). The tracker keeps, per
worker: requests in flight, prompt tokens still waiting for prefill, and the KV blocks
that active requests occupy. Blocks are counted once per worker however many active
requests share them, so requests with a common prefix do not look like N times the load.

It also keeps, per worker, the last :data:`TTFT_SAMPLES` times to first token the router
observed (dispatch to first chunk) with the load the request met, so that a cost model can
calibrate its prediction of each worker's speed online (:class:`TtftSample`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from infera.kv.native import choose

if TYPE_CHECKING:
    from infera.kv._native import LoadCell

TTFT_SAMPLES = 32


@dataclasses.dataclass(frozen=True, slots=True)
class TtftSample:
    """One observed time to first token and the work the router knew was ahead of it."""

    seconds: float  # dispatch to first chunk
    queued_tokens: int  # uncached prompt tokens already waiting on the worker at dispatch
    prefill_tokens: int  # this request's own uncached prompt tokens
    decoding: int  # requests past their first token on the worker at dispatch
    active_blocks: int  # distinct blocks its in-flight requests held at dispatch


@dataclasses.dataclass(slots=True)
class _WorkerLoad:
    in_flight: int = 0
    prefill_tokens: int = 0
    tail_blocks: int = 0
    prefilling: int = 0
    busy_since: float = 0.0  # when the worker started on the prefill queued now (see LoadTracker.prefill_age)
    block_refs: dict[int, int] = dataclasses.field(default_factory=dict)  # hash -> tickets holding it (C: a U64Map)
    ttfts: collections.deque[TtftSample] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=TTFT_SAMPLES))
    ttft_count: int = 0  # samples ever taken (a reader caches what it derived from them by this)
    ttft_seconds: collections.deque[float] = dataclasses.field(  # ``ttfts``' seconds, in the same order
        default_factory=lambda: collections.deque(maxlen=TTFT_SAMPLES))
    ttft_fastest: float = 0.0  # min(ttft_seconds) (0.0 while empty)


class Ticket(Protocol):
    """One request's hold on a worker's load, from :meth:`LoadTracker.begin` to :meth:`LoadTracker.end`."""

    @property
    def worker_id(self) -> str: ...
    @property
    def prefill_tokens(self) -> int: ...  # uncached prompt tokens the worker must compute
    @property
    def hashes(self) -> Sequence[int]: ...  # the prompt's full-block hashes (router hashes), may be empty
    @property
    def tail_blocks(self) -> int: ...  # blocks beyond ``hashes``: the partial prompt block and expected output
    @property
    def started(self) -> float: ...  # the clock's reading at begin
    @property
    def met(self) -> tuple[int, int, int]: ...  # (queued tokens, decoding, active blocks) at dispatch
    @property
    def prefilling(self) -> bool: ...  # no first token yet
    @property
    def open(self) -> bool: ...  # not ended


@dataclasses.dataclass(slots=True)
class _Ticket:
    """The Python path's :class:`Ticket` (the C path's is ``infera.kv._native.LoadTicket``)."""

    worker_id: str
    prefill_tokens: int  # uncached prompt tokens the worker must compute
    hashes: Sequence[int]  # the prompt's full-block hashes (router hashes), may be empty
    tail_blocks: int  # blocks beyond ``hashes``: the partial prompt block and expected output
    load: _WorkerLoad
    started: float = 0.0
    met: tuple[int, int, int] = (0, 0, 0)  # (queued tokens, decoding, active blocks) at dispatch
    prefilling: bool = True
    open: bool = True


class LoadTracker:
    """Per worker load. A ticket's three steps: ``begin(worker_id, prefill_tokens, hashes, tail_blocks) -> Ticket``
    when the request is placed; ``prefill_done(ticket)`` at its first token (the prompt no longer waits for compute;
    the time since begin is kept as one of the worker's TTFT samples; only the first call counts); ``end(ticket)``
    when it ends however it ended (releases everything it holds; idempotent). On the C path (``infera.kv._native``
    built with ``load_begin``) each step is one C call with no Python frame (``LoadCell``, ``LoadTicket``: the same
    values as the Python lines, issue 15's twelfth round); else they are the methods ``_begin``, ``_prefill_done``
    and ``_end`` below."""

    begin: Callable[[str, int, Sequence[int], int], Ticket]
    prefill_done: Callable[[Ticket], None]
    end: Callable[[Ticket], None]

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, native: bool | None = None) -> None:
        """``native``: count block references in C (``infera.kv._native``'s ``refs_add``/``refs_release``, one call
        per ticket instead of a step per block), False: in Python, None: C if built (as the prefix index)."""
        self._load: dict[str, _WorkerLoad | LoadCell] = {}
        self._clock = clock
        self._native: Any = choose(native)
        # C: each worker's references in a U64Map(False) (the counts inline: ~0.2 µs a ticket each way against ~2.4
        # for the dict, issue 15's ninth round); an extension built before load_refs_add keeps the dict and refs_add
        native_: Any = self._native
        self._map_refs = native_ is not None and hasattr(native_, "load_refs_add")
        if self._map_refs:
            self._refs_add, self._refs_release = native_.load_refs_add, native_.load_refs_release
        elif native_ is not None:
            self._refs_add, self._refs_release = native_.refs_add, native_.refs_release
        # the whole ticket in C (an extension built before load_begin runs the methods below)
        self._cells = native_ is not None and hasattr(native_, "load_begin")
        if self._cells:
            self.begin = functools.partial(native_.load_begin, self._load, clock, TTFT_SAMPLES)
            self.prefill_done = functools.partial(native_.load_prefill_done, clock, TtftSample)
            self.end = native_.load_end
        else:
            self.begin = self._begin
            self.prefill_done = cast(Callable[[Ticket], None], self._prefill_done)
            self.end = cast(Callable[[Ticket], None], self._end)

    def hold_parts(self) -> tuple[Any, ...] | None:
        """What ``_native.legs_hold`` reads to run :meth:`begin` within one leg's hold (csrc/hold18.c): the cells by
        worker, the clock and the TTFT window's length; None off the C path (an extension built before load_begin)."""
        return (self._load, self._clock, TTFT_SAMPLES) if self._cells else None

    def _begin(self, worker_id: str, prefill_tokens: int, hashes: Sequence[int], tail_blocks: int) -> Ticket:
        load = cast(_WorkerLoad | None, self._load.get(worker_id))
        if load is None:
            load = self._load[worker_id] = _WorkerLoad()
            if self._map_refs:
                load.block_refs = self._native.U64Map(False)
        met = (load.prefill_tokens, load.in_flight - load.prefilling, len(load.block_refs) + load.tail_blocks)
        load.in_flight += 1
        if not load.prefilling:
            load.busy_since = self._clock()
        load.prefilling += 1
        load.prefill_tokens += prefill_tokens
        load.tail_blocks += tail_blocks
        refs = load.block_refs
        if self._native is not None:
            self._refs_add(refs, hashes)
        else:
            for h in hashes:
                refs[h] = refs.get(h, 0) + 1
        return _Ticket(worker_id, prefill_tokens, hashes, tail_blocks, load, self._clock(), met)

    def _prefill_done(self, ticket: _Ticket) -> None:
        if ticket.open and ticket.prefilling:
            load = ticket.load
            queued, decoding, active = ticket.met
            now = self._clock()
            seconds = now - ticket.started
            load.ttfts.append(TtftSample(seconds, queued, ticket.prefill_tokens, decoding, active))
            window = load.ttft_seconds
            leaving = window[0] if len(window) == window.maxlen else None
            window.append(seconds)
            # the window's minimum, kept exact: looked for again only when the minimum itself left the window
            if len(window) == 1:
                load.ttft_fastest = seconds
            elif leaving is not None and leaving == load.ttft_fastest:
                load.ttft_fastest = min(window)
            elif seconds < load.ttft_fastest:
                load.ttft_fastest = seconds
            load.ttft_count += 1
            load.busy_since = now
            self._settle(ticket)

    def _settle(self, ticket: _Ticket) -> None:
        if ticket.prefilling:
            ticket.prefilling = False
            ticket.load.prefilling -= 1
            ticket.load.prefill_tokens -= ticket.prefill_tokens

    def _end(self, ticket: _Ticket) -> None:
        if not ticket.open:
            return
        self._settle(ticket)  # a request that failed or was cancelled first is no TTFT sample
        ticket.open = False
        load = ticket.load
        load.in_flight -= 1
        load.tail_blocks -= ticket.tail_blocks
        refs = load.block_refs
        if self._native is not None:
            self._refs_release(refs, ticket.hashes)
            return
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

    def prefill_age(self, worker_id: str) -> float:
        """Seconds the worker has been computing the prefill queued on it now (0 with none queued):
        since the request that found its queue empty was routed, or since its latest first token,
        whichever is later (work done before that went to prompts no longer queued)."""
        load = self._load.get(worker_id)
        return max(0.0, self._clock() - load.busy_since) if load and load.prefilling else 0.0

    def decoding(self, worker_id: str) -> int:
        """In-flight requests past their first token: the worker's running decode batch, as routed."""
        load = self._load.get(worker_id)
        return load.in_flight - load.prefilling if load else 0

    def ttft_samples(self, worker_id: str) -> tuple[int, Sequence[TtftSample]]:
        """(samples ever taken, the last :data:`TTFT_SAMPLES` of them, oldest first)."""
        load = self._load.get(worker_id)
        return (load.ttft_count, load.ttfts) if load else (0, ())

    def ttft_seconds(self, worker_id: str) -> Sequence[float]:
        """The ``seconds`` of :meth:`ttft_samples`' samples, in the same order (a cost sums them per decision)."""
        load = self._load.get(worker_id)
        return load.ttft_seconds if load else ()

    def ttft_fastest(self, worker_id: str) -> float:
        """The fastest of :meth:`ttft_seconds` (``min`` of them; 0.0 with none), kept as samples come and go."""
        load = self._load.get(worker_id)
        return load.ttft_fastest if load else 0.0

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
