"""Workers as bits: a slot per worker, Python ints as sets of workers, and the prefix walk over them.

The prefix index maps each router block hash to an int whose bit ``k`` is set when the worker
in slot ``k`` holds the block. Slots are reused lowest first after a worker leaves, so masks
stay as short as the fleet. A walk along a prompt's chain ANDs the masks and records the depth
at which each bit drops out: one dict lookup and one AND per block, whatever the number of
holders, plus one step per worker that drops out.
"""

from __future__ import annotations

import dataclasses
import heapq
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate, compress, count, islice, repeat, takewhile
from operator import add, and_, ne, or_, sub, xor
from typing import Any

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


@dataclasses.dataclass(slots=True)
class Run:
    """A walk's state after a prompt's leading blocks that two or more workers hold each (their
    masks all come from the shared table): valid for any prompt with the same first ``end``
    blocks while none of those masks changes."""

    end: int  # blocks covered
    last: int  # router hash of block ``end - 1``: a chained hash, so it names the whole prefix
    active: int  # workers holding all ``end`` blocks (0: the walk ended inside the run)
    result: dict[str, int]  # workers that dropped out before ``end``, with their depth (the caller's copy)


def walk(hashes: Sequence[int], shared: dict[int, int], held: MaskGet, names: list[str], *,
         resume: Run | None = None, capture: int = 0,
         guessed: MaskGet | None = None, allowed: int = 0) -> tuple[dict[str, int], Run | None]:
    """Per worker (by slot name), how many leading blocks of ``hashes`` its bit covers contiguously.

    ``shared``: the masks with two or more bits (a small table, cheap to probe); ``held``: every
    mask. With ``guessed``, a block also counts for the workers in ``allowed`` whose guessed bit
    is set. The walk goes in chunks of growing size, each a few passes in C: look the chunk's
    blocks up (``shared`` first), AND them cumulatively until no bit is left, and find where the
    running mask changes. Cost: one probe and one AND per block up to the deepest holder, plus
    one step per worker that drops out, whatever the number of holders.

    While no more than a few workers are left, a plain loop is cheaper (no look-ahead, small
    masks): the walk finishes with it, and a run in progress ends where it starts.

    ``resume``: start after a :class:`Run` that the caller checked applies to ``hashes``.
    ``capture`` (blocks, > 0; not with ``guessed``): also return the :class:`Run` of the
    prompt's leading shared blocks when it covers at least that many (and, after ``resume``,
    more than it), else None.
    """
    shared_get = shared.get
    n = len(hashes)
    result: dict[str, int]
    if resume is not None:
        base, active, result = resume.end, resume.active, dict(resume.result)
        if not active:
            return result, None
        in_run = capture > 0  # the run may go on where the prompt it was taken from ended
        capture = max(capture, base + 1)
    else:
        first = shared_get(hashes[0])
        in_run = first is not None and capture > 0 and guessed is None
        if first is None:
            first = held(hashes[0], 0)
        if guessed is not None:
            first |= guessed(hashes[0], 0) & allowed
        if not first:
            return {}, None
        base, active, result = 1, first, {}  # ``active``: the workers holding all ``base`` blocks walked
    run: Run | None = None
    size = _FIRST_CHUNK
    while base < n:
        if active.bit_count() <= _FEW:
            if in_run and base >= capture:  # every block so far was shared: the run ends here
                run = Run(base, hashes[base - 1], active, dict(result))
            result.update(_loop(hashes, base, active, held, guessed, allowed, names))
            return result, run
        chunk = hashes[base : base + size]
        masks: list[Any] = list(map(shared_get, chunk))
        cut = len(masks)  # where the run of shared blocks ends in this chunk
        if None in masks:
            if in_run:
                cut = masks.index(None)
            masks = [held(h, 0) if m is None else m for m, h in zip(masks, chunk, strict=True)]
        if guessed is not None:
            masks = list(map(or_, masks, map(and_, map(guessed, chunk, repeat(0)), repeat(allowed))))
        # running[i]: the workers holding blocks 0 .. base+i-1 (running[0] = active); stops before 0
        running = list(takewhile(bool, accumulate(masks, and_, initial=active)))
        steps = list(compress(count(), map(ne, running, islice(running, 1, None))))
        ends = len(running) <= len(masks)  # no worker holds block base+len(running)-1
        if in_run and (ends or cut < len(masks)):
            in_run = False
            if ends and len(running) - 1 < cut:  # the answer comes from shared masks alone
                _record_drops(result, running, steps, base, names)
                record(result, running[-1], base + len(running) - 1, names)
                end = base + len(running)
                if end >= capture:
                    run = Run(end, hashes[end - 1], 0, dict(result))
                return result, run
            k = bisect_left(steps, cut)
            _record_drops(result, running, steps[:k], base, names)
            if base + cut >= capture:
                run = Run(base + cut, hashes[base + cut - 1], running[cut], dict(result))
            steps = steps[k:]
        _record_drops(result, running, steps, base, names)
        if ends:
            record(result, running[-1], base + len(running) - 1, names)
            return result, run
        active = running[-1]
        base += len(masks)
        size = min(2 * size, _MAX_CHUNK)
    if in_run and n >= capture:
        run = Run(n, hashes[n - 1], active, dict(result))
    record(result, active, n, names)
    return result, run


_FIRST_CHUNK = 16  # blocks looked up beyond the deepest holder: at most one chunk
_FEW = 64  # workers left from which on the walk goes block by block (ANDs of small masks, no look-ahead)


def _loop(hashes: Sequence[int], base: int, active: int, held: MaskGet, guessed: MaskGet | None, allowed: int,
          names: list[str]) -> dict[str, int]:
    """The rest of a walk from block ``base`` (``active`` holding all blocks before it), one block at a time."""
    result: dict[str, int] = {}
    depth = base
    for local in islice(hashes, base, None):
        mask = held(local, 0)
        if guessed is not None:
            mask |= guessed(local, 0) & allowed
        still = active & mask
        if still != active:
            record(result, active ^ still, depth, names)
            if not still:
                return result
            active = still
        depth += 1
    record(result, active, depth, names)
    return result
_MAX_CHUNK = 512


def _record_drops(result: dict[str, int], running: list[int], steps: list[int], base: int, names: list[str]) -> None:
    """Workers in ``running[i]`` but not ``running[i + 1]`` hold ``base + i`` blocks, for each ``i`` in ``steps``."""
    if not steps:
        return
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
