"""Workers as bits: a slot per worker, Python ints as sets of workers, and the prefix walk over them.

The prefix index maps each router block hash to an int whose bit ``k`` is set when the worker
in slot ``k`` holds the block. Slots are reused lowest first after a worker leaves, so masks
stay as short as the fleet. A walk along a prompt's chain ANDs the masks and records the depth
at which each bit drops out: one dict lookup and one AND per block, whatever the number of
holders, plus one step per worker that drops out.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from itertools import accumulate, compress, count, islice, repeat, takewhile
from operator import add, and_, ne, sub, xor

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


def walk(hashes: Sequence[int], shared: dict[int, int], held: MaskGet, names: list[str]) -> dict[str, int]:
    """Per worker (by slot name), how many leading blocks of ``hashes`` its bit covers contiguously.

    ``shared``: the masks with two or more bits (a small table, cheap to probe); ``held``: every
    mask. The walk goes in chunks of growing size, each in a few passes in C: look the chunk's
    blocks up in ``shared`` (then ``held`` for the rest), AND them cumulatively until no bit is
    left, and find where the running mask changes. A prompt every worker holds costs one probe
    of the small table and one AND per block, and one step per worker that drops out.
    """
    shared_get = shared.get
    first = shared_get(hashes[0])
    if first is None:
        first = held(hashes[0], 0)
        if not first:
            return {}
    result: dict[str, int] = {}
    active = first
    base = 1  # blocks walked: ``active`` holds every one of them
    n = len(hashes)
    size = _FIRST_CHUNK
    while base < n:
        chunk = hashes[base : base + size]
        masks = list(map(shared_get, chunk))
        if None in masks:
            masks = [held(h, 0) if m is None else m for m, h in zip(masks, chunk, strict=True)]
        # running[i]: the workers holding blocks 0 .. base+i-1 (running[0] = active); stops before 0
        running = list(takewhile(bool, accumulate(masks, and_, initial=active)))
        steps = list(compress(count(), map(ne, running, islice(running, 1, None))))
        if steps:
            _record_drops(result, running, steps, base, names)
        if len(running) <= len(masks):  # no worker holds block base+len(running)-1
            record(result, running[-1], base + len(running) - 1, names)
            return result
        active = running[-1]
        base += len(masks)
        size = min(2 * size, _MAX_CHUNK)
    record(result, active, n, names)
    return result


_FIRST_CHUNK = 16  # blocks looked up beyond the deepest holder: at most one chunk
_MAX_CHUNK = 512


def _record_drops(result: dict[str, int], running: list[int], steps: list[int], base: int, names: list[str]) -> None:
    """Workers in ``running[i]`` but not ``running[i + 1]`` hold ``base + i`` blocks, for each ``i`` in ``steps``."""
    before = list(map(running.__getitem__, steps))
    after = list(map(running.__getitem__, map(_plus_one, steps)))
    gone = list(map(xor, before, after))
    depths = map(add, steps, repeat(base))
    if max(map(int.bit_count, gone)) == 1:  # one worker at a time: the names in C
        slots = map(sub, map(int.bit_length, gone), repeat(1))
        result.update(zip(map(names.__getitem__, slots), depths, strict=True))
        return
    for mask, depth in zip(gone, depths, strict=True):
        record(result, mask, depth, names)


_plus_one = (1).__add__


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
