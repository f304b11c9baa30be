"""Prefix index: which worker holds which KV blocks, fed by KV events, read by the router.

Blocks are keyed by the router's own chained hashes (``infera.kv.hashing``), rebuilt from
the token ids in each ``BlockStored`` event; the engine's hashes are kept only as opaque
ids so that ``BlockRemoved`` finds its block. A block whose parent the index does not know
(events were missed) is not inserted: its local hash cannot be computed, so it is counted
as an orphan instead.

Representation (ingest ~1 M block events/s; query cost independent of the number of holders):
each router hash maps to an int mask of the workers holding it (``infera.kv.bitmasks``), and
each worker maps engine hash -> router hash (``WorkerTable``): a removal is a dict pop and a
mask update, no per-block object, and runs of events are applied in whole-run passes in C. On the C
path both big tables (each worker's engine hash -> router hash, and router hash -> mask) are
``infera.kv._native.U64Map``s: open addressing over the 64-bit keys, key and value inline, so a lookup
reads one slot instead of a dict's index, entry and key int; the pure path keeps dicts (same answers).
The masks of router hashes two or more workers hold are also kept in a small table of their own
(``_shared``), which a query probes first; and a query remembers its walk over a long run of such
blocks at the start of a prompt (a hot system prompt), which the next query of that prefix resumes
until one of those masks changes.

Each block keeps the tiers (``medium``: "GPU", "CPU", ...) holding it; a block left only
below the device tier is also listed per worker, so that a scorer can give it partial
credit (:meth:`PrefixIndex.lower_tier_blocks`) at no cost while every block is on the device.

Besides confirmed blocks (from events only) the index holds *predicted* blocks: the
router's guess of what a worker caches after it routed a prompt there. They expire after
a TTL and count only when the caller asks for them (workers whose events are stale or
absent, or to cover the lag between a routing decision and its events).

Not thread-safe: one event loop owns it. Clocks: ``now``/``ttl`` for predictions are
seconds on whatever clock the caller uses consistently (``time.monotonic()`` by default);
event times in ``cache_view`` are wall-clock seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import chain, compress, groupby, islice, repeat
from operator import and_, attrgetter, ne, not_, or_, sub, xor
from typing import Any, cast

from infera.kv.bitmasks import Run, Slots, record, walk
from infera.kv.hashing import pure_block_hashes
from infera.kv.index_rows import RowRuns
from infera.kv.index_tables import Predictions, WorkerTable
from infera.kv.native import choose
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, TokenIds
from infera.transport.base import ReadySink, StreamState

CACHE_VIEW_MAX_HASHES = 256
RUN_MIN_BLOCKS = 64  # a query remembers the walk over a prompt's leading shared blocks from this many on
RUNS_MAX = 256  # remembered runs (by first router hash); the oldest goes first
WATCHED_MAX = 1 << 16  # router hashes the remembered runs may cover before all are forgotten
TOP_MEDIA = frozenset({"GPU", None})  # the device tier (None: an engine that does not say)
_PLAIN = "GPU"  # a block held in this medium only has no entry in WorkerTable.media
_HASHES = attrgetter("block_hashes")

Book = tuple[dict[str, int], dict[str, float], dict[str, float], float]
"""A reader's record of arrivals that :meth:`PrefixIndex.drain_ready` keeps in the same C call (batches, last, owed,
when), dicts by worker id: for a worker whose drain applied ``n`` batches, ``batches[worker] += n``, ``last[worker] =
when`` and its entry in ``owed`` dropped (:class:`infera.kv.feed.IndexFeed`'s ``_arrived``, less the log line)."""


@dataclasses.dataclass(slots=True)
class IndexCounters:
    """Totals since start; monotonic, for metrics."""

    block_stored: int = 0  # BlockStored events applied
    block_removed: int = 0  # BlockRemoved events applied
    all_blocks_cleared: int = 0  # AllBlocksCleared events applied
    orphan_blocks: int = 0  # stored blocks skipped: parent unknown or too few token ids
    unknown_removed: int = 0  # removed engine hashes the index did not hold
    block_size_mismatch: int = 0  # stored blocks skipped: block size differs from the index's

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class PrefixIndex:
    """Router hash -> bitmask of workers, plus per-worker tables for O(1) removes."""

    def __init__(self, block_size: int | None = None, *, native: bool | None = None) -> None:
        """``block_size``: if set, stored blocks of another size are skipped and counted
        (the router hashes prompts with one block size; a mismatch would silently give 0 hits).
        ``native``: run the per-block loops in C (``infera.kv._native``; ImportError if it is not built),
        False: in Python; None (default): C if built and ``INFERA_PURE_PYTHON`` is not set. Same results.
        """
        self.block_size = block_size
        self._native: Any = choose(native)
        self.counters = IndexCounters()
        self._workers: dict[str, WorkerTable] = {}
        self._slots = Slots()
        # router hash -> mask of workers holding it (confirmed); on the C path a U64Map (csrc/index.c: the key
        # inline, no int object per key), as are the workers' engine-hash tables (WorkerTable.blocks)
        self._holders: dict[int, int] = {} if self._native is None else self._native.U64Map(True)
        # The same masks for the router hashes two or more workers hold, in a table of their own: a
        # query's lookups of a hot prefix then probe a small table instead of the whole index.
        self._shared: dict[int, int] = {}
        # Walks over prompts' leading shared blocks, by first router hash, and the router hashes they
        # cover: any change to one of those masks forgets every run (see overlaps).
        self._runs: dict[int, Run] = {}
        self._watched: set[int] = set()
        # The C path's runs: their masks as rows, patched when one changes (Python's runs are forgotten).
        self._rows = None if self._native is None else RowRuns(self._native, self._slots.names, self._watched, RUNS_MAX,
                                                                    WATCHED_MAX)
        # A batch's payload straight into the tables (apply_payload); not for an index whose block size no event
        # can have (C reads 0 as "any")
        self._apply_payload = getattr(self._native, "apply_payload", None) if block_size is None or block_size > 0 \
            else None
        self._payload_size = block_size or 0
        # A ZMQ socket's queued payloads straight into the tables (drain_socket): with apply_payload only
        self._drain = getattr(self._native, "drain_socket", None) if self._apply_payload is not None else None
        # A ZMTP stream's (drain_stream): likewise
        self._stream = getattr(self._native, "drain_stream", None) if self._apply_payload is not None else None
        # A catch-up's ready ZMTP streams, each drained as by drain_stream, in one call (drain_ready): likewise
        self._ready = getattr(self._native, "drain_ready", None) if self._stream is not None else None
        self._clear_worker = getattr(self._native, "clear_worker", None)  # _clear in C (an older build: Python's)
        self._guesses = Predictions(self._native)
        self._predicted = self._guesses.masks  # router hash -> mask of workers with a prediction
        self._expiry_heap = self._guesses.heap

    @property
    def native(self) -> Any:
        """The C module this index runs its loops with (``infera.kv._native``), or None on the pure path: a reader
        that has C parts of its own follows the index's choice."""
        return self._native

    @property
    def takes_payloads(self) -> bool:
        """Whether :meth:`apply_payload` can take batches (the C path, built with it)."""
        return self._apply_payload is not None

    @property
    def takes_sockets(self) -> bool:
        """Whether :meth:`drain_socket` can read sockets (the C path, built with it, and pyzmq's libzmq loaded)."""
        return self._drain is not None and self._native.zmq_ready() is not None

    @property
    def takes_streams(self) -> bool:
        """Whether :meth:`drain_stream` can read ZMTP streams (the C path, built with it)."""
        return self._stream is not None

    def _worker(self, worker_id: str) -> WorkerTable:
        worker = self._workers.get(worker_id)
        if worker is None:
            slot = self._slots.take(worker_id)
            worker = self._workers[worker_id] = WorkerTable(slot, 1 << slot)
            if self._native is not None:
                worker.blocks = self._native.U64Map(False)
                if self._guesses.map_add is not None:  # its predictions' expiries too (Predictions.add)
                    worker.predicted = self._native.U64Map(True)
                worker.tables = self._tables(worker)
        return worker

    # -- events --------------------------------------------------------------------------

    def apply(self, worker_id: str, batch: EventBatch, now: float | None = None) -> None:
        """Apply a batch's events in order to ``worker_id``'s cache.

        ``worker_id`` names one event stream (a data-parallel rank publishes its own).
        ``now`` (wall-clock seconds, default ``time.time()``) is recorded as the last event time.
        """
        worker = self._workers.get(worker_id)
        if worker is None:
            worker = self._worker(worker_id)
        events = batch.events
        if len(events) == 1:  # most batches (one stored event, or one removed block): no grouping
            event = events[0]
            kind = event.__class__
            if kind is BlockStored:
                self.counters.block_stored += 1
                self._store(worker, event)  # type: ignore[arg-type]
            elif kind is BlockRemoved:
                self._remove_run(worker, events)  # type: ignore[arg-type]
            else:
                self._apply_run(worker, kind, events)
        else:
            for kind, run in groupby(events, type):  # vLLM: one BlockRemoved per block, in runs
                if kind is BlockRemoved:
                    self._remove_run(worker, list(run))  # type: ignore[arg-type]
                elif kind is BlockStored:
                    for event in run:
                        self.counters.block_stored += 1
                        self._store(worker, event)  # type: ignore[arg-type]
                else:
                    self._apply_run(worker, kind, list(run))
        worker.last_event_ts = batch.ts
        worker.last_applied_at = time.time() if now is None else now

    def apply_payload(self, worker_id: str, payload: bytes, now: float | None = None) -> bool:
        """:meth:`apply` of ``decode_batch(payload)`` in one C call, for the batches it takes: vLLM 0.32's form on
        the device, to a worker the index knows with no block in other tiers (csrc/index_payload.c says exactly).
        True: applied, with the tables, counters and times :meth:`apply` would leave. False: nothing changed (the
        pure path, an extension without it, or a batch it does not take): decode and :meth:`apply` it instead.
        """
        worker = self._workers.get(worker_id)
        if worker is None or self._apply_payload is None:  # a new worker: its table is made by apply
            return False
        got = self._apply_payload(*worker.tables, payload, self._payload_size)
        if got is None:
            return False
        self._applied(worker, now, *got)
        return True

    def _applied(self, worker: WorkerTable, now: float | None, ts: Any, stored: int, removed: int, orphans: Any,
                 unknown: int, mismatched: int, touched: Any) -> None:
        """What the C apply of one or more payloads reports, added to the counters, the orphans and the touched
        rows, and the worker's times set (the same for one batch, :meth:`apply_payload`, and a drained run of
        them, :meth:`drain_socket`: every part is a sum)."""
        counters = self.counters
        if stored:
            counters.block_stored += stored
        if removed:
            counters.block_removed += removed
        if orphans:
            self._orphans(worker, orphans)
        if unknown:
            counters.unknown_removed += unknown
        if mismatched:
            counters.block_size_mismatch += mismatched
        if touched:
            self._touch(touched)
        worker.last_event_ts = ts
        worker.last_applied_at = time.time() if now is None else now

    def _apply_run(self, worker: WorkerTable, kind: type, run: list[Any]) -> None:
        """A run of events of one class (the exact classes first; a subclass is applied as its base)."""
        if kind is BlockRemoved or (kind is not BlockStored and issubclass(kind, BlockRemoved)):
            self._remove_run(worker, run)
        elif kind is BlockStored or issubclass(kind, BlockStored):
            for event in run:
                self.counters.block_stored += 1
                self._store(worker, event)
        elif issubclass(kind, AllBlocksCleared):
            for _ in run:
                self.counters.all_blocks_cleared += 1
                self._clear(worker)

    def drain_socket(self, worker_id: str, handle: int, expected: int | None,
                     now: float | None = None) -> tuple[int, int | None, int, Any] | None:
        """:meth:`apply_payload` of every ``[topic, seq, payload]`` batch queued on a libzmq SUB socket (its address
        ``handle``), in sequence from seq ``expected`` (None: any), in one C call (csrc/zmq_drain.c says exactly what
        it leaves to the caller). Returns (a ``DRAIN_*`` code of infera.transport.base, the next expected seq, the
        batches applied, what goes with the code), the tables, counters and times left as :meth:`apply_payload`
        would leave them batch by batch; None: nothing read (a worker the index does not know, or no C path).
        """
        worker = self._workers.get(worker_id)
        if worker is None or self._drain is None:
            return None
        status, expected, n, ts, stored, removed, orphans, unknown, mismatched, touched, extra = self._drain(
            handle, expected, *worker.tables, self._payload_size)
        if n:
            self._applied(worker, now, ts, stored, removed, orphans, unknown, mismatched, touched)
        return status, expected, n, extra

    def drain_stream(self, worker_id: str, fd: int, buffer: bytearray, expected: int | None,
                     now: float | None = None) -> tuple[int, int | None, int, Any] | None:
        """:meth:`drain_socket` for a ZMTP stream read without libzmq: the TCP socket ``fd`` and ``buffer``, what was
        read of it and not parsed (csrc/zmtp_drain.c says exactly what it takes and leaves); the same answer."""
        worker = self._workers.get(worker_id)
        if worker is None or self._stream is None:
            return None
        status, expected, n, ts, stored, removed, orphans, unknown, mismatched, touched, extra = self._stream(
            fd, buffer, expected, *worker.tables, self._payload_size)
        if n:
            self._applied(worker, now, ts, stored, removed, orphans, unknown, mismatched, touched)
        return status, expected, n, extra

    @property
    def takes_ready(self) -> bool:
        """Whether :meth:`drain_ready` can take a catch-up's ZMTP streams (the C path, built with it)."""
        return self._ready is not None

    def drain_ready(
        self, epfd: int, streams: dict[int, StreamState], now: float | None = None, book: Book | None = None,
    ) -> tuple[list[int], list[tuple[StreamState, int, Any]], list[tuple[str, int]]]:
        """A catch-up's ``epoll_wait(0)`` on ``epfd`` and :meth:`drain_stream` of every ready ZMTP stream of
        ``streams`` (descriptor -> its link's state) that is not busy, for a worker the index knows, in one C call
        (csrc/zmtp_drain.c, ``drain_ready``), each state's ``expected`` set to its drain's. Returns (the ready
        descriptors it did not drain, (state, ``DRAIN_*`` code, what goes with it) for each drain that ended other
        than with nothing queued, (worker id, batches applied) for each drain that applied any); the tables,
        counters and times left as :meth:`drain_stream` leaves them stream by stream. ``book``: the caller's
        record of arrivals, kept by the same call for each drain that applied batches (:data:`Book` says how)."""
        assert self._ready is not None
        others, left, arrived, touched = self._ready(epfd, streams, self._workers, self._payload_size,
                                                     self.counters, now, book)
        if touched:
            self._touch(touched)
        return others, left, arrived

    def ready_sink(self, book: tuple[dict[str, int], dict[str, float], dict[str, float]], clock: Callable[[], float],
                   blind: set[str], arrived: Callable[[list[tuple[str, int]]], None]) -> ReadySink | None:
        """:meth:`drain_ready` bound once as a reader's catch-up (csrc/ready_bound.c): a C callable of (epoll
        descriptor, streams) that returns (others, left) as ``drain_ready`` does, books each drain that applied
        batches in ``book`` (batches, last, owed) with ``clock()`` read once, at the first such drain, and calls
        Python back only for what is left to it: the touched rows (:meth:`_touch`) and, while ``blind`` is not empty,
        ``arrived(list of (worker id, batches applied))``. None: the C path is not built with it (the reader calls
        :meth:`drain_ready` itself). The tables bound are the index's own for its lifetime."""
        native = getattr(self._native, "ready_sink", None) if self._ready is not None else None
        if native is None:
            return None

        def post(got: list[tuple[str, int]], touched: list[int]) -> None:
            if touched:
                self._touch(touched)
            if got:
                arrived(got)

        return cast(ReadySink, functools.partial(native, self._workers, self._payload_size, self.counters, *book,
                                                 clock, blind, post))

    def _tables(self, worker: WorkerTable) -> tuple[Any, ...]:
        """What the C loops take: the worker's tables, the index's, and the worker's bit (kept in
        ``worker.tables``)."""
        return (worker.blocks, worker.media, worker.extra, worker.lower, worker.predicted, self._holders,
                self._shared, self._watched, self._predicted, worker.bit)

    def _remove_run_native(self, worker: WorkerTable, events: list[BlockRemoved], hashes: list[int],
                           stop: int | None) -> None:
        """:meth:`_remove_run` in C, block by block; a block held in other tiers goes through :meth:`_remove`.
        ``stop``: the C loop ran already, up to that block (no remembered walk was watched); None: not yet."""
        tables, start, n = worker.tables, 0, len(hashes)
        # Their router hashes, while remembered runs are watched: the C loop says whether one of those masks
        # changed, and its rows are patched from these.
        locals_ = list(map(worker.blocks.get, hashes)) if self._watched else []
        while True:
            if stop is None:
                stop, unknown, forget = self._native.remove_blocks(*tables, hashes, start)
                self.counters.unknown_removed += unknown
                if forget:
                    self._touch([local for local in locals_ if local is not None])
            if stop >= n:
                return
            offset = 0  # the event holding block ``stop`` says the medium
            for event in events:
                offset += len(event.block_hashes)
                if offset > stop:
                    self._remove(worker, hashes[stop], event.medium)
                    break
            start, stop = stop + 1, None

    def _remove_run(self, worker: WorkerTable, events: list[BlockRemoved]) -> None:
        self.counters.block_removed += len(events)
        hashes = events[0].block_hashes if len(events) == 1 else list(chain.from_iterable(map(_HASHES, events)))
        if self._native is not None:
            if not self._watched:  # no remembered walk to patch: one C call unless a block is in other tiers
                stop, unknown, _ = self._native.remove_blocks(*worker.tables, hashes, 0)
                if unknown:
                    self.counters.unknown_removed += unknown
                if stop < len(hashes):
                    self._remove_run_native(worker, events, hashes, stop)
                return
            self._remove_run_native(worker, events, hashes, None)
            return
        if worker.media and not worker.media.keys().isdisjoint(hashes):  # tiers to track: block by block
            for event in events:
                for engine_hash in event.block_hashes:
                    self._remove(worker, engine_hash, event.medium)
            return
        # Every block of the run is on the device only, so any removal drops it whatever the
        # medium: whole-run passes, in C, give the state block-by-block removal would.
        locals_ = list(map(worker.blocks.pop, hashes, repeat(None)))
        unknown = locals_.count(None)
        if unknown:
            self.counters.unknown_removed += unknown
            locals_ = [local for local in locals_ if local is not None]
        gone: list[int] = locals_  # type: ignore[assignment]  # router hashes no engine block holds now
        if worker.extra and not worker.extra.keys().isdisjoint(gone):
            removed, gone = gone, self._release_shared(worker.extra, gone)
            if worker.media:  # a block still held through another engine block may be left below the device
                for local in set(removed).difference(gone):
                    self._relower(worker, local)
        holders = self._holders
        masks = list(map(xor, map(holders.__getitem__, gone), repeat(worker.bit)))
        holders.update(zip(gone, masks, strict=True))
        if any(masks):  # held by others too: those were in the shared table
            self._unshare(list(compress(gone, masks)), list(filter(None, masks)))
        if 0 in masks:  # no holder left
            for local in compress(gone, map(not_, masks)):
                del holders[local]
        if worker.lower:
            for local in gone:
                worker.lower.pop(local, None)
        if worker.predicted:  # the events are fresher than our guesses
            for local in worker.predicted.keys() & gone:
                self._guesses.drop(worker, local)

    @staticmethod
    def _release_shared(extra: dict[int, int], locals_: list[int]) -> list[int]:
        """Drop one reference per entry of ``locals_``; the router hashes left with none, once each."""
        dropped = Counter(locals_)
        for local in extra.keys() & dropped.keys():
            refs = extra[local] + 1 - dropped[local]
            if refs > 0:
                del dropped[local]  # still held through another engine block
                if refs == 1:
                    del extra[local]
                else:
                    extra[local] = refs - 1
            else:
                del extra[local]
        return list(dropped)

    def _unshare(self, locals_: list[int], masks: list[int]) -> None:
        """One worker left each of ``locals_``, which it shared with others: ``masks`` (non-zero) are
        the holders left; still shared, or held by one worker now."""
        shared = self._shared
        single = list(map(not_, map(and_, masks, map(sub, masks, repeat(1)))))
        shared.update(zip(compress(locals_, map(not_, single)), compress(masks, map(not_, single)), strict=True))
        if any(single):
            for local in compress(locals_, single):
                del shared[local]
        if self._watched and not self._watched.isdisjoint(locals_):
            self._touch(locals_)

    def _touch(self, locals_: Iterable[int]) -> None:
        """The masks of some of ``locals_`` (router hashes) that remembered runs cover changed: C patches the
        rows of its runs, Python forgets its runs."""
        if self._rows is None:
            self._forget_runs()
        else:
            self._rows.touch(locals_)

    def _forget_runs(self) -> None:
        self._runs.clear()
        self._watched.clear()
        if self._rows is not None:
            self._rows.forget()

    def _store(self, worker: WorkerTable, event: BlockStored) -> None:
        hashes = event.block_hashes
        n = len(hashes)
        bs = event.block_size
        if self.block_size is not None and bs != self.block_size:
            self.counters.block_size_mismatch += n
            return
        tokens = event.token_ids
        medium = event.medium
        if medium == _PLAIN and type(tokens) is TokenIds and self._native is not None and bs > 0:
            # As decoded, on the device (the live case): parent lookup, hashing from the msgpack bytes (no int per
            # token) and the store loop in one C call; None: not msgpack ints in uint32, the general path below.
            got = self._native.store_packed(*worker.tables, hashes, event.parent_block_hash, tokens.packed, bs)
            if got is not None:
                locals_, done, forget = got
                if locals_ is None:
                    self._orphans(worker, n)
                    return
                if len(locals_) < n:
                    self._orphans(worker, n - len(locals_))
                    hashes = hashes[: len(locals_)]
                if forget:
                    self._touch(locals_)
                if done < len(hashes):  # a block held in other tiers: Python goes on
                    self._store_each(worker, hashes[done:], locals_[done:], medium)
                return
        blocks = worker.blocks
        if event.parent_block_hash is None:
            parent = 0
        else:
            found = blocks.get(event.parent_block_hash)
            if found is None:  # missed the parent's event: its children cannot be hashed
                self._orphans(worker, n)
                return
            parent = found
        locals_ = None
        if self._native is not None and bs > 0:  # None: a token id outside uint32 (or not msgpack ints)
            if type(tokens) is TokenIds:  # as decoded: hashed from the msgpack bytes, no int per token
                locals_ = self._native.chain_hashes_packed(tokens.packed, n, bs, parent)
            else:
                locals_ = self._native.chain_hashes(tokens, 0, n, bs, parent)
        if locals_ is None:
            if type(tokens) is TokenIds:
                tokens = tokens.ids()  # KvEventDecodeError if not msgpack
            if len(tokens) > n * bs:
                tokens = tokens[: n * bs]
            locals_ = pure_block_hashes(tokens, bs, parent) if bs > 0 else []
        if len(locals_) < n:  # too few token ids: the tail blocks cannot be hashed
            self._orphans(worker, n - len(locals_))
            hashes = hashes[: len(locals_)]
        if self._native is not None and medium == _PLAIN:
            done, forget = self._native.store_blocks(*worker.tables, hashes, locals_, 0)
            if forget:
                self._touch(locals_)
            if done == len(hashes):
                return
            hashes, locals_ = hashes[done:], locals_[done:]  # a block held in other tiers: Python goes on
        elif medium == _PLAIN and blocks.keys().isdisjoint(hashes) and self._store_new(worker, hashes, locals_):
            return
        self._store_each(worker, hashes, locals_, medium)

    def _orphans(self, worker: WorkerTable, n: int) -> None:
        """``n`` stored blocks not inserted: the parent's event was missed, or too few token ids to hash them."""
        worker.orphan_blocks += n
        self.counters.orphan_blocks += n

    def _store_each(self, worker: WorkerTable, hashes: Sequence[int], locals_: Sequence[int],
                    medium: str | None) -> None:
        """Stored blocks one by one (any tier; ``_store``'s bulk paths leave these)."""
        top = medium in TOP_MEDIA
        blocks, holders, bit = worker.blocks, self._holders, worker.bit
        extra, lower, predicted = worker.extra, worker.lower, worker.predicted
        for engine_hash, local in zip(hashes, locals_, strict=True):
            if engine_hash in blocks:
                self._add_tier(worker, engine_hash, local, medium)
                continue
            blocks[engine_hash] = local
            if medium != _PLAIN:
                worker.media[engine_hash] = [medium]
            mask = holders.get(local, 0)
            if mask & bit:  # another engine block of this worker has the same tokens
                extra[local] = extra.get(local, 0) + 1
            else:
                if mask:
                    holders[local] = self._shared[local] = mask | bit
                    if local in self._watched:
                        self._touch((local,))
                else:
                    holders[local] = bit
                if not top:
                    lower[local] = str(medium)
            if top and lower:
                lower.pop(local, None)
            if predicted:
                self._guesses.drop(worker, local)  # confirmed now

    def _store_new(self, worker: WorkerTable, hashes: list[int], locals_: list[int]) -> bool:
        """The common case in bulk, in C: engine hashes new to the worker, on the device, with
        distinct router hashes (one the worker holds already gains a reference). False, having
        changed nothing, when a hash repeats within the event: the caller goes block by block.
        """
        blocks, holders, bit = worker.blocks, self._holders, worker.bit
        n = len(locals_)
        old = list(map(holders.get, locals_, repeat(0)))
        before = len(blocks)
        blocks.update(zip(hashes, locals_, strict=True))
        if len(blocks) - before < n:  # an engine hash repeats within the event
            for engine_hash in hashes:
                blocks.pop(engine_hash, None)
            return False
        if any(old):  # some held before, by others or through another engine block
            if len(set(locals_)) < n:  # a router hash repeats within the event
                for engine_hash in hashes:
                    blocks.pop(engine_hash, None)
                return False
            new = list(map(or_, old, repeat(bit)))
            holders.update(zip(locals_, repeat(bit)))
            holders.update(zip(compress(locals_, old), compress(new, old), strict=True))
            own = list(map(and_, old, repeat(bit)))
            if any(own):  # held already via another engine block: one more reference
                extra = worker.extra
                for local in compress(locals_, own):
                    extra[local] = extra.get(local, 0) + 1
            others = list(map(ne, new, repeat(bit)))  # shared with other workers now
            if any(others):
                self._shared.update(zip(compress(locals_, others), compress(new, others), strict=True))
                if self._watched and not self._watched.isdisjoint(compress(locals_, others)):
                    self._touch(compress(locals_, others))
        else:
            # A block held by this worker alone maps to the worker's own ``bit`` object: no int per block.
            size = len(holders)
            holders.update(zip(locals_, repeat(bit)))
            if len(holders) - size < n:  # a router hash repeats within the event
                for engine_hash, local in zip(hashes, locals_, strict=True):
                    blocks.pop(engine_hash, None)
                    holders.pop(local, None)
                return False
        if worker.lower:
            for local in locals_:
                worker.lower.pop(local, None)
        if worker.predicted:  # confirmed now
            for local in worker.predicted.keys() & set(locals_):
                self._guesses.drop(worker, local)
        return True

    def _add_tier(self, worker: WorkerTable, engine_hash: int, local: int, medium: str | None) -> None:
        """A stored block the worker already holds: at most a new tier for it."""
        media = worker.media.get(engine_hash)
        if medium in (media if media is not None else (_PLAIN,)):
            return
        if media is None:
            worker.media[engine_hash] = [_PLAIN, medium]
        else:
            media.append(medium)
        if medium in TOP_MEDIA and worker.lower:
            worker.lower.pop(local, None)

    def _remove(self, worker: WorkerTable, engine_hash: int, medium: str | None) -> None:
        local = worker.blocks.get(engine_hash)
        if local is None:
            self.counters.unknown_removed += 1
            return
        media = worker.media.get(engine_hash)
        if media is not None:
            if medium in media:
                media.remove(medium)
            else:  # unknown tier: the engine no longer has it where we thought; drop it all
                media.clear()
            if media:
                if all(m not in TOP_MEDIA for m in media):  # left only in a lower tier
                    if local in worker.extra:
                        self._relower(worker, local)  # unless another engine block has it on the device
                    else:
                        worker.lower[local] = str(media[0])
                elif media == [_PLAIN]:
                    del worker.media[engine_hash]
                return
            del worker.media[engine_hash]
        # else on the device only: any removal drops it (an unknown tier means the same)
        del worker.blocks[engine_hash]
        refs = worker.extra.get(local)
        if refs is not None:  # still held through another engine block
            if refs == 1:
                del worker.extra[local]
            else:
                worker.extra[local] = refs - 1
            self._relower(worker, local)
            return
        mask = self._holders[local] ^ worker.bit
        if mask:
            self._holders[local] = mask
            self._unshare([local], [mask])
        else:
            del self._holders[local]
        worker.lower.pop(local, None)
        self._guesses.drop(worker, local)  # the event is fresher than our guess

    @staticmethod
    def _relower(worker: WorkerTable, local: int) -> None:
        """A router hash several engine blocks share changed: it is below the device iff every copy is."""
        media = [worker.media.get(eh) or [_PLAIN] for eh, held in worker.blocks.items() if held == local]
        if media and all(m not in TOP_MEDIA for ms in media for m in ms):
            worker.lower[local] = str(media[0][0])
        else:
            worker.lower.pop(local, None)

    def _clear(self, worker: WorkerTable) -> None:
        """Forget every block and prediction of the worker (AllBlocksCleared, or the worker leaving)."""
        if self._clear_worker is not None and type(worker.predicted) is not dict:
            # In C, O(the worker's blocks) without a Python step per block (csrc/index_clear.c): a real engine's
            # reset of a 32k-token cache does not stall the loop; media, extra and lower are rare and cleared here.
            touched = self._clear_worker(worker.blocks, self._holders, self._shared, self._watched, worker.predicted,
                                         self._predicted, worker.bit)
            if touched:
                self._touch(touched)
            worker.media.clear()
            worker.extra.clear()
            worker.lower.clear()
            return
        holders, bit = self._holders, worker.bit
        keep = ~bit
        for local in worker.blocks.values():
            mask = holders.get(local)
            if mask is not None and mask & bit:
                mask &= keep
                if mask:
                    holders[local] = mask
                    self._unshare([local], [mask])
                else:
                    del holders[local]
        worker.blocks.clear()
        worker.media.clear()
        worker.extra.clear()
        worker.lower.clear()
        for local in list(worker.predicted):
            self._guesses.drop(worker, local)

    # -- predictions ---------------------------------------------------------------------

    def predict(self, worker_id: str, hashes: Sequence[int], ttl: float, now: float) -> None:
        """Expect ``worker_id`` to cache blocks ``hashes`` (router hashes) until ``now + ttl``.

        A later prediction of the same block extends it. Predictions never become
        confirmed blocks; events do that.
        """
        heap = self._expiry_heap
        if heap and heap[0][0] <= now:  # Predictions.prune's own test, without its call when nothing expired
            self._guesses.prune(now, self._workers)
        worker = self._workers.get(worker_id)
        if worker is None:
            worker = self._worker(worker_id)
        if ttl > 0:
            self._guesses.add(worker_id, worker, hashes, now + ttl)

    def predict_parts(self) -> tuple[Any, ...] | None:
        """What ``_native.legs_hold`` reads to run :meth:`predict` without its Python frames (csrc/hold18.c, issue
        15's sixteenth round): the expiry heap, the prune, the worker tables and their maker, the prediction masks,
        the heap's sequence and its push, none of them ever replaced. None where predict's lines are others (the
        pure path, predictions kept in dicts, a subclass's predict)."""
        guesses = self._guesses
        if (self._native is None or guesses.map_add is None or guesses.map_add is not
                getattr(self._native, "predict_map_prefetch", None) or type(self).predict is not PrefixIndex.predict
                or type(guesses) is not Predictions):
            return None
        return (self._expiry_heap, guesses.prune, self._workers, self._worker, self._predicted, guesses.seq,
                heapq.heappush)

    # -- queries -------------------------------------------------------------------------

    def overlaps(
        self,
        hashes: Sequence[int],
        now: float | None = None,
        use_predicted: bool | Collection[str] = False,
    ) -> dict[str, int]:
        """Per worker, how many leading blocks of ``hashes`` it holds contiguously.

        Only workers holding the first block appear (0 is omitted). ``use_predicted``:
        False counts confirmed blocks only; True also counts unexpired predictions of every
        worker; a collection of worker ids counts predictions for those workers only.
        ``now`` is the prediction clock (default ``time.monotonic()``).
        Cost: one dict lookup and one mask AND per prompt block up to the deepest holder, plus
        one step per worker that drops out, whatever the number of holders.
        """
        if not hashes:
            return {}
        if use_predicted is not False and self._expiry_heap:
            self._guesses.prune(time.monotonic() if now is None else now, self._workers)
            if self._predicted:
                workers = self._workers
                allowed = -1 if use_predicted is True else sum({workers[w].bit for w in use_predicted if w in workers})
                if self._rows is not None:
                    over_rows = self._rows.guessed(hashes, self._shared, self._holders, self._slots.names,
                                                   RUN_MIN_BLOCKS, self._predicted, allowed)
                    if over_rows is not None:
                        return over_rows
                if self._native is not None:
                    guessed: dict[str, int] = self._native.walk(hashes, self._shared, self._holders, self._slots.names,
                                                                None, 0, self._predicted, allowed)[0]
                    return guessed
                return walk(hashes, self._shared, self._holders.get, self._slots.names,
                            guessed=self._predicted.get, allowed=allowed)[0]
        if self._rows is not None:  # the same answers; its runs are rows of masks, patched (index_rows)
            return self._rows.overlaps(hashes, self._shared, self._holders, self._slots.names, RUN_MIN_BLOCKS)
        first = hashes[0]
        run = self._runs.get(first)
        if run is None or len(hashes) < run.end or hashes[run.end - 1] != run.last:
            run = None
        found, run = walk(hashes, self._shared, self._holders.get, self._slots.names, resume=run,
                          capture=RUN_MIN_BLOCKS)
        if run is not None:
            self._remember(first, run, hashes)
        return found

    def holding(self, block: int, now: float | None = None) -> list[str]:
        """The workers that hold router hash ``block``, confirmed or predicted (unexpired at ``now``, default
        ``time.monotonic()``), lowest slot first: ``list(overlaps([block], now, use_predicted=True))`` without the
        walk (kv-aware asks it once per request, of the previous prompt's last block)."""
        mask: int = self._holders.get(block, 0)
        if self._expiry_heap:
            self._guesses.prune(time.monotonic() if now is None else now, self._workers)
            if self._predicted:
                mask |= self._predicted.get(block, 0)
        if not mask:
            return []
        names = self._slots.names
        if mask.bit_count() == 1:
            return [names[mask.bit_length() - 1]]
        out: dict[str, int] = {}
        record(out, mask, 1, names)
        return list(out)

    def decide_parts(self) -> tuple[Any, ...] | None:
        """What kv-aware's one C call (``_native.kv_decide``) reads to answer :meth:`holding` and take
        :meth:`overlaps_and_confirmed`' one walk itself, without their Python frames (csrc/decide17.c, issue 15's
        fifteenth round): the tables those methods read, none of them ever replaced, and the predictions' prune.
        None on the pure path."""
        if self._native is None:
            return None
        return (self._holders, self._shared, self._predicted, self._expiry_heap, self._slots.names,
                self._rows.runs if self._rows is not None else None, self._guesses.prune, self._workers,
                RUN_MIN_BLOCKS)

    def overlaps_and_confirmed(self, hashes: Sequence[int], now: float | None = None) -> tuple[dict[str, int], int]:
        """``(overlaps(hashes, now, use_predicted=True), longest confirmed prefix)``: the second is
        ``max(overlaps(hashes, now).values(), default=0)``, the most leading blocks of ``hashes`` one worker holds
        by its KV events alone (what the kv-aware cost's stay floor reads), and 0 when the first is empty.

        On the C path, when no remembered run covers the prompt, one walk gives both (``_native.walk_both``);
        otherwise, and in Python, it is those two queries."""
        if hashes and self._native is not None and self._expiry_heap:
            self._guesses.prune(time.monotonic() if now is None else now, self._workers)
            if self._predicted:
                names = self._slots.names
                # RowRuns.guessed answers None, changing nothing, unless a remembered run starts with the prompt's
                # first block or its first RUN_MIN_BLOCKS blocks are all shared (capture_rows): when neither the
                # first nor the last of those is shared and no run starts there, straight to the one walk
                first, m, shared = hashes[0], max(RUN_MIN_BLOCKS, 1), self._shared
                capturable = len(hashes) >= m and first in shared and hashes[m - 1] in shared
                over_rows = None if self._rows is None or (not capturable and first not in self._rows.runs) else \
                    self._rows.guessed(hashes, shared, self._holders, names, RUN_MIN_BLOCKS, self._predicted, -1)
                if over_rows is None:
                    both: tuple[dict[str, int], int] = self._native.walk_both(hashes, self._shared, self._holders,
                                                                              names, self._predicted, -1)
                    return both
                return over_rows, max(self.overlaps(hashes, now=now).values(), default=0) if over_rows else 0
        found = self.overlaps(hashes, now=now, use_predicted=True)
        if not found:
            return found, 0
        return found, max(self.overlaps(hashes, now=now).values(), default=0)

    def _remember(self, first: int, run: Run, hashes: Sequence[int]) -> None:
        runs, watched = self._runs, self._watched
        if len(watched) + run.end > WATCHED_MAX:
            self._forget_runs()
        elif len(runs) >= RUNS_MAX and first not in runs:
            del runs[next(iter(runs))]  # its hashes stay watched: a change there forgets too much, never too little
        runs[first] = run
        watched.update(islice(hashes, run.end))

    def lower_tier_blocks(self, worker_id: str, hashes: Sequence[int], count: int) -> dict[str, int]:
        """Of the first ``count`` blocks of ``hashes`` (what :meth:`overlaps` found on the worker),
        how many it holds only in a lower tier than the device, by medium (e.g. ``{"CPU": 3}``).

        Empty, in O(1), for a worker whose confirmed blocks are all on the device (the common
        case). Predicted blocks count as device blocks.
        """
        worker = self._workers.get(worker_id)
        if worker is None or not worker.lower:
            return {}
        lower = worker.lower
        out: dict[str, int] = {}
        for local in islice(hashes, count):
            medium = lower.get(local)
            if medium is not None:
                out[medium] = out.get(medium, 0) + 1
        return out

    # -- workers and views ---------------------------------------------------------------

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker: its blocks, predictions and counters. Unknown ids are ignored."""
        worker = self._workers.pop(worker_id, None)
        if worker is not None:
            self._clear(worker)
            self._slots.release(worker.slot)
            if self._rows is not None:
                self._rows.released()

    def workers(self) -> list[str]:
        """Workers the index has heard of (events or predictions), sorted."""
        return sorted(self._workers)

    def block_count(self, worker_id: str) -> int:
        """Confirmed blocks (distinct engine hashes, any medium) the worker holds; 0 if unknown."""
        worker = self._workers.get(worker_id)
        return len(worker.blocks) if worker is not None else 0

    def held(self, worker_id: str) -> tuple[int, bool]:
        """``(block_count(worker_id), whether it holds any block only below the device)``: one lookup for what
        kv-aware's terms read per candidate (with False, :meth:`lower_tier_blocks` is empty for any prompt)."""
        worker = self._workers.get(worker_id)
        return (len(worker.blocks), bool(worker.lower)) if worker is not None else (0, False)

    def cache_view(self, worker_id: str, max_hashes: int = CACHE_VIEW_MAX_HASHES) -> dict[str, Any]:
        """A JSON-able summary of one worker's cache, for the admin API."""
        worker = self._workers.get(worker_id) or WorkerTable(-1, 0)
        by_medium: dict[str, int] = {}
        plain = len(worker.blocks) - len(worker.media)
        if plain:
            by_medium[_PLAIN] = plain
        for media in worker.media.values():
            for medium in media:
                key = medium or "unknown"
                by_medium[key] = by_medium.get(key, 0) + 1
        blocks = worker.blocks
        engine_hashes = list(islice(blocks, max_hashes)) if type(blocks) is dict else cast(Any, blocks).head(max_hashes)
        return {
            "worker_id": worker_id,
            "blocks": len(worker.blocks),
            "blocks_by_medium": by_medium,
            "orphan_blocks": worker.orphan_blocks,
            "predicted_blocks": len(worker.predicted),
            "last_event_ts": worker.last_event_ts,
            "last_event_at": worker.last_applied_at,
            "engine_hashes": engine_hashes,
            "engine_hashes_truncated": len(worker.blocks) > len(engine_hashes),
        }
