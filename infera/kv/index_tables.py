"""The prefix index's tables: one worker's cache, and the router's predictions for every worker.

Router hashes are the index's block keys (``infera.kv.hashing``); a worker's ``bit`` is its
slot in the index's worker masks (``infera.kv.bitmasks``).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(slots=True)
class WorkerTable:
    """One worker's cache. Only ``blocks`` grows with the cache in the common case; the side
    tables hold the rarer blocks: in a tier other than GPU alone (``media``), behind a router
    hash several engine blocks share (``extra``, e.g. one prompt under two LoRA adapters),
    held only below the device (``lower``)."""

    slot: int
    bit: int  # 1 << slot
    blocks: dict[int, int] = dataclasses.field(default_factory=dict)  # engine hash -> router hash
    media: dict[int, list[str | None]] = dataclasses.field(default_factory=dict)  # engine hash -> tiers if not [GPU]
    extra: dict[int, int] = dataclasses.field(default_factory=dict)  # router hash -> engine blocks with it, minus one
    predicted: dict[int, float] = dataclasses.field(default_factory=dict)  # router hash -> expiry (C: a U64Map(True))
    lower: dict[int, str] = dataclasses.field(default_factory=dict)  # router hash -> its medium, if not on GPU
    orphan_blocks: int = 0
    last_event_ts: float | None = None  # engine clock (batch ts)
    last_applied_at: float | None = None  # router wall clock
    # On the C path, what its loops take (PrefixIndex._tables), built once: none of these tables is replaced.
    tables: tuple[Any, ...] = dataclasses.field(default=(), repr=False, compare=False)


class Predictions:
    """Unexpired predictions: per router hash a mask of the workers expected to hold it, and an
    expiry heap with one entry per :meth:`add` (its router hashes), pruned lazily. ``native``: the C module
    (``infera.kv._native``) whose ``predict_add`` runs :meth:`add`'s per-hash loop, or None for Python's."""

    def __init__(self, native: Any = None) -> None:
        self._native = native
        # C: each worker's expiries in a U64Map(True) (``WorkerTable.predicted``; the index makes them when this is
        # set), added to by predict_map_add: ~1.8 µs a routed prompt's re-prediction against ~4.9 in a dict (issue
        # 15's ninth round); an extension built before it keeps the dicts and predict_add. predict_map_prefetch is
        # predict_map_add with the prompt's ~64 expiry slots prefetched first (issue 15's twelfth round: they are
        # mostly cold by then, and the loop waited on each miss in turn)
        self.map_add = None if native is None else \
            getattr(native, "predict_map_prefetch", None) or getattr(native, "predict_map_add", None)
        # C: an expired add's loop (predict_expire, issue 15's sixteenth round), where the expiries are U64Maps
        self._expire = getattr(native, "predict_expire", None)
        self.masks: dict[int, int] = {}
        self.heap: list[tuple[float, int, str, list[int]]] = []  # (expiry, seq, worker id, router hashes)
        self.seq = itertools.count(1)  # the heap entries' tie-break, in the order of their adds

    def add(self, worker_id: str, worker: WorkerTable, hashes: Sequence[int], expiry: float) -> None:
        """Expect ``worker`` to hold ``hashes`` until ``expiry``; a later expiry extends a prediction."""
        predicted, masks, bit = worker.predicted, self.masks, worker.bit
        fresh: list[int]
        if self.map_add is not None:  # the same loop in C over the worker's U64Map
            fresh = self.map_add(predicted, masks, bit, hashes, expiry)
        elif self._native is not None:  # the same loop in C: one call per routed request instead of ~60 steps
            fresh = self._native.predict_add(predicted, masks, bit, hashes, expiry)
        else:
            fresh = []
            for local in hashes:
                old = predicted.get(local)
                if old is None:
                    masks[local] = masks.get(local, 0) | bit
                elif old >= expiry:
                    continue
                predicted[local] = expiry
                fresh.append(local)
        if fresh:
            heapq.heappush(self.heap, (expiry, next(self.seq), worker_id, fresh))

    def drop(self, worker: WorkerTable, local: int) -> None:
        if worker.predicted.pop(local, None) is None:
            return
        mask = self.masks[local] ^ worker.bit
        if mask:
            self.masks[local] = mask
        else:
            del self.masks[local]

    def prune(self, now: float, workers: dict[str, WorkerTable]) -> None:
        """Forget predictions that expired at or before ``now``; O(log n) per expired :meth:`add`."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            expiry, _, worker_id, hashes = heapq.heappop(heap)
            worker = workers.get(worker_id)
            if worker is None:
                continue
            if self._expire is not None and self.map_add is not None:  # the lines below in one call
                self._expire(worker.predicted, self.masks, worker.bit, hashes, expiry)
                continue
            predicted = worker.predicted
            for local in hashes:
                if predicted.get(local) == expiry:  # not extended since
                    self.drop(worker, local)
