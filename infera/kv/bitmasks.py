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
from itertools import islice

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
