"""Prefix index: which worker holds which KV blocks, fed by KV events, read by the router.

Blocks are keyed by the router's own chained hashes (``infera.kv.hashing``), rebuilt from
the token ids in each ``BlockStored`` event; the engine's hashes are kept only as opaque
ids so that ``BlockRemoved`` finds its block. A block whose parent the index does not know
(events were missed) is not inserted: its local hash cannot be computed, so it is counted
as an orphan instead.

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
import heapq
import time
from collections.abc import Collection, Sequence
from itertools import islice
from typing import Any

from infera.kv.hashing import block_hashes
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

CACHE_VIEW_MAX_HASHES = 256
TOP_MEDIA = frozenset({"GPU", None})  # the device tier (None: an engine that does not say)


@dataclasses.dataclass(slots=True)
class _Block:
    local: int  # the router's hash of this block
    media: list[str | None]  # tiers holding it ("GPU", "CPU", ...); usually one


@dataclasses.dataclass(slots=True)
class _Worker:
    blocks: dict[int, _Block] = dataclasses.field(default_factory=dict)  # engine hash -> block
    local_refs: dict[int, int] = dataclasses.field(default_factory=dict)  # local hash -> engine blocks with it
    predicted: dict[int, float] = dataclasses.field(default_factory=dict)  # local hash -> expiry
    lower: dict[int, str] = dataclasses.field(default_factory=dict)  # local hash -> its medium, if not on GPU
    orphan_blocks: int = 0
    last_event_ts: float | None = None  # engine clock (batch ts)
    last_applied_at: float | None = None  # router wall clock


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
    """Block hash -> workers, plus per-worker tables for O(1) removes."""

    def __init__(self, block_size: int | None = None) -> None:
        """``block_size``: if set, stored blocks of another size are skipped and counted
        (the router hashes prompts with one block size; a mismatch would silently give 0 hits).
        """
        self.block_size = block_size
        self.counters = IndexCounters()
        self._workers: dict[str, _Worker] = {}
        self._holders: dict[int, set[str]] = {}  # local hash -> workers holding it (confirmed)
        self._predicted: dict[int, dict[str, float]] = {}  # local hash -> worker -> expiry
        self._expiry_heap: list[tuple[float, int, str, int]] = []  # (expiry, seq, worker, local hash)
        self._seq = 0

    # -- events --------------------------------------------------------------------------

    def apply(self, worker_id: str, batch: EventBatch, now: float | None = None) -> None:
        """Apply a batch's events in order to ``worker_id``'s cache.

        ``worker_id`` names one event stream (a data-parallel rank publishes its own).
        ``now`` (wall-clock seconds, default ``time.time()``) is recorded as the last event time.
        """
        worker = self._workers.get(worker_id)
        if worker is None:
            worker = self._workers[worker_id] = _Worker()
        for event in batch.events:
            if isinstance(event, BlockStored):
                self.counters.block_stored += 1
                self._store(worker_id, worker, event)
            elif isinstance(event, BlockRemoved):
                self.counters.block_removed += 1
                for engine_hash in event.block_hashes:
                    self._remove(worker_id, worker, engine_hash, event.medium)
            elif isinstance(event, AllBlocksCleared):
                self.counters.all_blocks_cleared += 1
                self._clear(worker_id, worker)
        worker.last_event_ts = batch.ts
        worker.last_applied_at = time.time() if now is None else now

    def _store(self, worker_id: str, worker: _Worker, event: BlockStored) -> None:
        n = len(event.block_hashes)
        bs = event.block_size
        if self.block_size is not None and bs != self.block_size:
            self.counters.block_size_mismatch += n
            return
        if event.parent_block_hash is None:
            parent = 0
        else:
            parent_block = worker.blocks.get(event.parent_block_hash)
            if parent_block is None:  # missed the parent's event: its children cannot be hashed
                worker.orphan_blocks += n
                self.counters.orphan_blocks += n
                return
            parent = parent_block.local
        locals_ = block_hashes(event.token_ids[: n * bs], bs, parent) if bs > 0 else []
        if len(locals_) < n:  # too few token ids: the tail blocks cannot be hashed
            missing = n - len(locals_)
            worker.orphan_blocks += missing
            self.counters.orphan_blocks += missing
        medium = event.medium
        top = medium in TOP_MEDIA
        for engine_hash, local in zip(event.block_hashes, locals_, strict=False):
            block = worker.blocks.get(engine_hash)
            if block is not None:
                if medium not in block.media:
                    block.media.append(medium)
                    if top and worker.lower:
                        worker.lower.pop(local, None)
                continue
            worker.blocks[engine_hash] = _Block(local, [medium])
            refs = worker.local_refs.get(local, 0)
            worker.local_refs[local] = refs + 1
            if not top and refs == 0:
                worker.lower[local] = str(medium)
            elif top and worker.lower:
                worker.lower.pop(local, None)
            if refs == 0:
                holders = self._holders.get(local)
                if holders is None:
                    self._holders[local] = {worker_id}
                else:
                    holders.add(worker_id)
            if worker.predicted:
                self._drop_prediction(worker_id, worker, local)  # confirmed now

    def _remove(self, worker_id: str, worker: _Worker, engine_hash: int, medium: str | None) -> None:
        block = worker.blocks.get(engine_hash)
        if block is None:
            self.counters.unknown_removed += 1
            return
        if medium in block.media:
            block.media.remove(medium)
        else:  # unknown tier: the engine no longer has it where we thought; drop it all
            block.media.clear()
        if block.media:
            if all(m not in TOP_MEDIA for m in block.media):  # left only in a lower tier
                worker.lower[block.local] = str(block.media[0])
            return
        del worker.blocks[engine_hash]
        local = block.local
        refs = worker.local_refs[local] - 1
        if refs:
            worker.local_refs[local] = refs
            return
        del worker.local_refs[local]
        worker.lower.pop(local, None)
        holders = self._holders[local]
        holders.discard(worker_id)
        if not holders:
            del self._holders[local]
        self._drop_prediction(worker_id, worker, local)  # the event is fresher than our guess

    def _clear(self, worker_id: str, worker: _Worker) -> None:
        for local in worker.local_refs:
            holders = self._holders[local]
            holders.discard(worker_id)
            if not holders:
                del self._holders[local]
        worker.blocks.clear()
        worker.local_refs.clear()
        worker.lower.clear()
        for local in list(worker.predicted):
            self._drop_prediction(worker_id, worker, local)

    # -- predictions ---------------------------------------------------------------------

    def predict(self, worker_id: str, hashes: Sequence[int], ttl: float, now: float) -> None:
        """Expect ``worker_id`` to cache blocks ``hashes`` (router hashes) until ``now + ttl``.

        A later prediction of the same block extends it. Predictions never become
        confirmed blocks; events do that.
        """
        self._prune(now)
        worker = self._workers.get(worker_id)
        if worker is None:
            worker = self._workers[worker_id] = _Worker()
        expiry = now + ttl
        if ttl <= 0:
            return
        for local in hashes:
            if worker.predicted.get(local, -1.0) >= expiry:
                continue
            worker.predicted[local] = expiry
            by_worker = self._predicted.get(local)
            if by_worker is None:
                self._predicted[local] = {worker_id: expiry}
            else:
                by_worker[worker_id] = expiry
            self._seq += 1
            heapq.heappush(self._expiry_heap, (expiry, self._seq, worker_id, local))

    def _drop_prediction(self, worker_id: str, worker: _Worker, local: int) -> None:
        if worker.predicted.pop(local, None) is None:
            return
        by_worker = self._predicted[local]
        del by_worker[worker_id]
        if not by_worker:
            del self._predicted[local]

    def _prune(self, now: float) -> None:
        """Forget predictions that expired at or before ``now``; O(log n) per expired entry."""
        heap = self._expiry_heap
        while heap and heap[0][0] <= now:
            expiry, _, worker_id, local = heapq.heappop(heap)
            worker = self._workers.get(worker_id)
            if worker is not None and worker.predicted.get(local) == expiry:  # not extended since
                self._drop_prediction(worker_id, worker, local)

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
        """
        if not hashes:
            return {}
        holders = self._holders
        predicted: dict[int, dict[str, float]] | None = None
        allowed: Collection[str] | None = None
        if use_predicted is not False and self._expiry_heap:
            self._prune(time.monotonic() if now is None else now)
            if self._predicted:
                predicted = self._predicted
                allowed = None if use_predicted is True else use_predicted
        result: dict[str, int] = {}
        if predicted is None:
            first = holders.get(hashes[0])
            if not first:
                return {}
            active = set(first)
            i = 1
            for local in islice(hashes, 1, None):
                held = holders.get(local)
                if held is None:
                    break
                if not active <= held:
                    for w in active - held:
                        result[w] = i
                    active &= held
                    if not active:
                        return result
                i += 1
            return _finish(result, active, i)
        active = self._first_held(hashes[0], predicted, allowed)
        i = 1
        for local in islice(hashes, 1, None):
            if not active:
                break
            held = holders.get(local)
            missing = active - held if held else set(active)
            if missing:
                guessed = predicted.get(local)
                if guessed:
                    if allowed is None:
                        missing.difference_update(guessed)
                    else:
                        missing = {w for w in missing if w not in guessed or w not in allowed}
                if missing:
                    for w in missing:
                        result[w] = i
                    active -= missing
            i += 1
        return _finish(result, active, i)

    def _first_held(
        self, local: int, predicted: dict[int, dict[str, float]], allowed: Collection[str] | None
    ) -> set[str]:
        held = self._holders.get(local)
        out = set(held) if held else set()
        guessed = predicted.get(local)
        if guessed:
            out.update(guessed if allowed is None else (w for w in guessed if w in allowed))
        return out

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
            self._clear(worker_id, worker)

    def workers(self) -> list[str]:
        """Workers the index has heard of (events or predictions), sorted."""
        return sorted(self._workers)

    def block_count(self, worker_id: str) -> int:
        """Confirmed blocks (distinct engine hashes, any medium) the worker holds; 0 if unknown."""
        worker = self._workers.get(worker_id)
        return len(worker.blocks) if worker is not None else 0

    def cache_view(self, worker_id: str, max_hashes: int = CACHE_VIEW_MAX_HASHES) -> dict[str, Any]:
        """A JSON-able summary of one worker's cache, for the admin API."""
        worker = self._workers.get(worker_id) or _Worker()
        by_medium: dict[str, int] = {}
        for block in worker.blocks.values():
            for medium in block.media:
                key = medium or "unknown"
                by_medium[key] = by_medium.get(key, 0) + 1
        engine_hashes = list(worker.blocks)[:max_hashes]
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


def _finish(result: dict[str, int], active: set[str], count: int) -> dict[str, int]:
    for w in active:
        result[w] = count
    return result
