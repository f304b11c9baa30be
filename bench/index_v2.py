"""Frozen copy of the PrefixIndex, its query walk, block hashing and KV-event decoder as they were at
main 2d3553e (after issue 15's first round: bitmasks, msgspec), kept only so that bench/index_bench.py
measures before and after the second round side by side in one run, and so that the property test
can check the new index against it."""

# ruff: noqa
# mypy: ignore-errors
from __future__ import annotations
from collections import Counter
from collections.abc import Callable, Sequence
from collections.abc import Collection, Sequence
from collections.abc import Sequence
from itertools import chain, compress, groupby, islice, repeat
from itertools import islice
from operator import and_, attrgetter, not_, or_, xor
from typing import Any
import dataclasses
import heapq
import msgspec
import struct
import time
import xxhash
from infera.kv.index_tables import Predictions, WorkerTable
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KvEvent, _Unsaid, _decode_general


_xxh3 = xxhash.xxh3_64_intdigest


class PromptIds(list[int]):
    """Token ids that know the block hashes of a leading part already hashed (see kv.prompt_cache).

    ``origin``: the ids as the cache holds them; both fields below are trusted only while
    these ids still equal it (a caller that edits the list in place gets a plain hashing).
    ``known_hashes``: block size -> hashes of leading full blocks of ``origin`` (chain from 0).
    ``sink``: where ``block_hashes`` stores the full result for later prompts.
    """

    __slots__ = ("known_hashes", "origin", "sink")

    def __init__(self, ids: Sequence[int] = ()) -> None:
        super().__init__(ids)
        self.origin: list[int] | None = None
        self.known_hashes: dict[int, list[int]] | None = None
        self.sink: dict[int, list[int]] | None = None


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids``; a partial tail block is ignored.

    ``parent`` is the hash of the block before the first one (0 = the chain starts at
    token 0). Token ids must fit in uint32 (struct.error otherwise). Returns one hash
    per full block, in order; an empty list when there is no full block.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_blocks = len(token_ids) // block_size
    if n_blocks == 0:
        return []
    if parent == 0 and type(token_ids) is PromptIds and token_ids.origin == token_ids:
        known = token_ids.known_hashes.get(block_size, []) if token_ids.known_hashes else []
        k = min(len(known), n_blocks)
        out = known[:k] + _chain(token_ids, k, n_blocks, block_size, known[k - 1] if k else 0)
        if token_ids.sink is not None:
            token_ids.sink[block_size] = list(out)  # the caller may keep and change ``out``
        return out
    return _chain(token_ids, 0, n_blocks, block_size, parent)


def _chain(token_ids: Sequence[int], first: int, n_blocks: int, block_size: int, parent: int) -> list[int]:
    """Hashes of blocks ``first..n_blocks-1``, chained from ``parent``."""
    if first >= n_blocks:
        return []
    n_tokens = (n_blocks - first) * block_size
    lo = first * block_size
    # struct.pack is the fastest list -> uint32 bytes path in CPython (about 9 ns a token,
    # array('I') about 13); the format string is cached by the struct module.
    body = token_ids if lo == 0 and n_tokens == len(token_ids) else token_ids[lo : lo + n_tokens]
    view = memoryview(struct.pack(f"<{n_tokens}I", *body))
    step = block_size * 4
    out: list[int] = []
    h = parent
    for start in range(0, n_tokens * 4, step):
        h = _xxh3(view[start : start + step], seed=h)
        out.append(h)
    return out


_BYTE_BITS = tuple(tuple(j for j in range(8) if b >> j & 1) for b in range(256))

MaskGet = Callable[[int, int], int]  # dict.get of router hash -> mask


class Slots:
    """Worker id <-> bit slot."""

    def __init__(self) -> None:
        self.names: list[str] = []  # slot -> worker id ("" while free)
        self._free: list[int] = []  # heap

    def take(self, worker_id: str) -> int:
        if self._free:
            slot = heapq.heappop(self._free)
            self.names[slot] = worker_id
        else:
            slot = len(self.names)
            self.names.append(worker_id)
        return slot

    def release(self, slot: int) -> None:
        """Free a slot; the caller has cleared its bit from every mask."""
        self.names[slot] = ""
        heapq.heappush(self._free, slot)


def walk(hashes: Sequence[int], held: MaskGet, names: list[str]) -> dict[str, int]:
    """Per worker (by slot name), how many leading blocks of ``hashes`` its bit covers contiguously."""
    active = held(hashes[0], 0)
    if not active:
        return {}
    result: dict[str, int] = {}
    depth = 1
    for local in islice(hashes, 1, None):
        still = active & held(local, 0)
        if still != active:
            record(result, active ^ still, depth, names)
            if not still:
                return result
            active = still
        depth += 1
    record(result, active, depth, names)
    return result


def walk_guessed(hashes: Sequence[int], held: MaskGet, guessed: MaskGet, allowed: int,
                 names: list[str]) -> dict[str, int]:
    """:func:`walk` where a block also counts for the workers in ``allowed`` whose ``guessed`` bit is set."""
    active = held(hashes[0], 0) | guessed(hashes[0], 0) & allowed
    if not active:
        return {}
    result: dict[str, int] = {}
    depth = 1
    for local in islice(hashes, 1, None):
        still = active & (held(local, 0) | guessed(local, 0) & allowed)
        if still != active:
            record(result, active ^ still, depth, names)
            if not still:
                return result
            active = still
        depth += 1
    record(result, active, depth, names)
    return result


def record(result: dict[str, int], mask: int, depth: int, names: list[str]) -> None:
    """``result[worker] = depth`` for each worker whose bit is set in ``mask`` (non-zero)."""
    if mask.bit_count() == 1:  # one worker: the common case
        result[names[mask.bit_length() - 1]] = depth
        return
    for k, byte in enumerate(mask.to_bytes((mask.bit_length() + 7) // 8, "little")):
        if byte:
            base = k * 8
            for j in _BYTE_BITS[byte]:
                result[names[base + j]] = depth

class _WireBatch(msgspec.Struct, array_like=True, gc=False):
    """``[ts, events, dp_rank]`` with every event in vLLM 0.32's map form (the fast path)."""

    ts: float
    events: list[KvEvent]
    data_parallel_rank: Any = None


_fast_decoder = msgspec.msgpack.Decoder(_WireBatch)


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack ``EventBatch``; unknown event types are skipped."""
    try:
        wire = _fast_decoder.decode(payload)
    except msgspec.DecodeError:  # not vLLM 0.32's map form (or not valid at all): the general path
        return _decode_general(payload)
    for ev in wire.events:
        if ev.__class__ is not AllBlocksCleared and ev.medium.__class__ is _Unsaid:  # type: ignore[union-attr]
            ev.medium = None  # type: ignore[union-attr]  # left out on the wire, as the general path reads it
    return EventBatch(wire.ts, wire.events, wire.data_parallel_rank)


CACHE_VIEW_MAX_HASHES = 256
TOP_MEDIA = frozenset({"GPU", None})  # the device tier (None: an engine that does not say)
_PLAIN = "GPU"  # a block held in this medium only has no entry in WorkerTable.media
_HASHES = attrgetter("block_hashes")


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

    def __init__(self, block_size: int | None = None) -> None:
        """``block_size``: if set, stored blocks of another size are skipped and counted
        (the router hashes prompts with one block size; a mismatch would silently give 0 hits).
        """
        self.block_size = block_size
        self.counters = IndexCounters()
        self._workers: dict[str, WorkerTable] = {}
        self._slots = Slots()
        self._holders: dict[int, int] = {}  # router hash -> mask of workers holding it (confirmed)
        self._guesses = Predictions()
        self._predicted = self._guesses.masks  # router hash -> mask of workers with a prediction
        self._expiry_heap = self._guesses.heap

    def _worker(self, worker_id: str) -> WorkerTable:
        worker = self._workers.get(worker_id)
        if worker is None:
            slot = self._slots.take(worker_id)
            worker = self._workers[worker_id] = WorkerTable(slot, 1 << slot)
        return worker

    # -- events --------------------------------------------------------------------------

    def apply(self, worker_id: str, batch: EventBatch, now: float | None = None) -> None:
        """Apply a batch's events in order to ``worker_id``'s cache.

        ``worker_id`` names one event stream (a data-parallel rank publishes its own).
        ``now`` (wall-clock seconds, default ``time.time()``) is recorded as the last event time.
        """
        worker = self._worker(worker_id)
        for kind, run in groupby(batch.events, type):  # vLLM: one BlockRemoved per block, in runs
            if issubclass(kind, BlockRemoved):
                self._remove_run(worker, list(run))  # type: ignore[arg-type]
            elif issubclass(kind, BlockStored):
                for event in run:
                    self.counters.block_stored += 1
                    self._store(worker, event)  # type: ignore[arg-type]
            elif issubclass(kind, AllBlocksCleared):
                for _ in run:
                    self.counters.all_blocks_cleared += 1
                    self._clear(worker)
        worker.last_event_ts = batch.ts
        worker.last_applied_at = time.time() if now is None else now

    def _remove_run(self, worker: WorkerTable, events: list[BlockRemoved]) -> None:
        self.counters.block_removed += len(events)
        hashes = events[0].block_hashes if len(events) == 1 else list(chain.from_iterable(map(_HASHES, events)))
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

    def _store(self, worker: WorkerTable, event: BlockStored) -> None:
        hashes = event.block_hashes
        n = len(hashes)
        bs = event.block_size
        if self.block_size is not None and bs != self.block_size:
            self.counters.block_size_mismatch += n
            return
        blocks = worker.blocks
        if event.parent_block_hash is None:
            parent = 0
        else:
            found = blocks.get(event.parent_block_hash)
            if found is None:  # missed the parent's event: its children cannot be hashed
                worker.orphan_blocks += n
                self.counters.orphan_blocks += n
                return
            parent = found
        tokens = event.token_ids
        if len(tokens) > n * bs:
            tokens = tokens[: n * bs]
        locals_ = block_hashes(tokens, bs, parent) if bs > 0 else []
        if len(locals_) < n:  # too few token ids: the tail blocks cannot be hashed
            missing = n - len(locals_)
            worker.orphan_blocks += missing
            self.counters.orphan_blocks += missing
            hashes = hashes[: len(locals_)]
        medium = event.medium
        holders, bit = self._holders, worker.bit
        if medium == _PLAIN and blocks.keys().isdisjoint(hashes) and self._store_new(worker, hashes, locals_):
            return
        top = medium in TOP_MEDIA
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
                holders[local] = mask | bit
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
        masks = dict(zip(locals_, map(holders.get, locals_, repeat(0)), strict=True))
        before = len(blocks)
        blocks.update(zip(hashes, locals_, strict=True))
        if len(masks) < len(locals_) or len(blocks) - before < len(locals_):
            for engine_hash in hashes:
                blocks.pop(engine_hash, None)
            return False
        if any(map(and_, masks.values(), repeat(bit))):  # held already via other engine blocks
            extra = worker.extra
            for local in compress(masks, map(and_, masks.values(), repeat(bit))):
                extra[local] = extra.get(local, 0) + 1
        holders.update(zip(masks, map(or_, masks.values(), repeat(bit)), strict=True))
        if worker.lower:
            for local in locals_:
                worker.lower.pop(local, None)
        if worker.predicted:  # confirmed now
            for local in worker.predicted.keys() & masks.keys():
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
        holders = self._holders
        keep = ~worker.bit
        for local in worker.blocks.values():
            mask = holders.get(local)
            if mask is not None:
                mask &= keep
                if mask:
                    holders[local] = mask
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
        self._guesses.prune(now, self._workers)
        worker = self._worker(worker_id)
        if ttl > 0:
            self._guesses.add(worker_id, worker, hashes, now + ttl)

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
                return walk_guessed(hashes, self._holders.get, self._predicted.get, allowed, self._slots.names)
        return walk(hashes, self._holders.get, self._slots.names)

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

    def workers(self) -> list[str]:
        """Workers the index has heard of (events or predictions), sorted."""
        return sorted(self._workers)

    def block_count(self, worker_id: str) -> int:
        """Confirmed blocks (distinct engine hashes, any medium) the worker holds; 0 if unknown."""
        worker = self._workers.get(worker_id)
        return len(worker.blocks) if worker is not None else 0

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
        engine_hashes = list(islice(worker.blocks, max_hashes))
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
