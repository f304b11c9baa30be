"""Remembered walks for the C path of the prefix index: a hot prefix's masks as rows of words, patched in place.

A query of a prompt whose leading blocks two or more workers hold each (a hot system prompt everywhere)
ANDs one mask per block. The index remembers, per first router hash, the masks of that leading stretch
as rows of ``width`` bytes in one ``bytearray`` (little-endian ints, a row per block) and the walk's state
after them. When one of those masks changes (a store or an eviction on any worker) the event path only
notes the row (:meth:`RowRuns.touch`, a set intersection and a set add); the next query of the prefix
rewrites the noted rows from the index's table and updates the depth of just the workers whose bits changed
(a column scan of the rows in C), or, after many changes, walks the rows in order in C
(``_native.walk_rows``: ~2k rows of 1024 workers are ~280 KB read sequentially) instead of looking 2k
masks up in the index's dicts; then it goes on past the stretch as usual. With predictions the rows are
walked with each row's guesses ORed in (the guesses change with every routing decision, so they are not kept).

Rows are exact only while every change to their masks reaches :meth:`RowRuns.touch`. The index's store and
removal paths report the router hashes in ``watched`` whose masks changed while two or more workers held
them before or after; a row whose mask has fallen below two holders (later changes would go unreported), or
gained a worker whose slot lies beyond the row's width, drops its run instead (the next query captures it
again).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

ROWS_MAX_BYTES = 32 << 20  # rows of all remembered runs; beyond it every run is forgotten
PATCH_MAX = 8  # rows changed since a run's last query up to which depths are patched, not walked again


@dataclasses.dataclass(slots=True)
class Rows:
    """One remembered run: the masks of ``hashes`` (a prompt's leading blocks) as rows of ``width`` bytes."""

    hashes: list[int]
    rows: bytearray
    width: int  # bytes per row, a multiple of 8, with room for at least one slot beyond the fleet's at capture
    active: int | None  # workers holding every row's block (None: walk the rows again)
    result: dict[str, int] | None  # workers that dropped out within the rows, with their depth
    keys: set[int] = dataclasses.field(default_factory=set)  # ``hashes`` as a set


class RowRuns:
    """The C path's remembered runs, by first router hash, and where each router hash they cover sits."""

    def __init__(self, native: Any, names: list[str], watched: set[int], runs_max: int, watched_max: int) -> None:
        """``names``: the index's worker names by slot; ``watched``: its set of router hashes whose mask changes
        its store and removal paths report (kept equal to the router hashes the runs cover)."""
        self._native = native
        self._names = names
        self._watched = watched
        self._runs_max = runs_max
        self._watched_max = watched_max
        self.runs: dict[int, Rows] = {}
        self._at: dict[int, tuple[Rows, int]] = {}  # router hash -> its run and row
        self._pending: set[int] = set()  # router hashes of rows whose mask changed since their run's last query
        self._bytes = 0

    def forget(self) -> None:
        self.runs.clear()
        self._at.clear()
        self._pending.clear()
        self._watched.clear()
        self._bytes = 0

    def touch(self, locals_: Iterable[int]) -> None:
        """The masks of ``locals_`` (router hashes; any, remembered or not) may have changed: note their rows."""
        if self._at:
            self._pending.update(self._watched.intersection(locals_))

    def released(self) -> None:
        """A worker's slot was freed (its name may go to another): depths are walked again, not patched by name."""
        if self._pending:
            for run in self.runs.values():
                if not self._pending.isdisjoint(run.keys):
                    run.active = run.result = None

    def _settle(self, run: Rows, mine: set[int], shared: dict[int, int], holders: dict[int, int]) -> bool:
        """Rewrite the rows of ``mine`` (router hashes noted since the run's last query) from ``holders``, and the
        depths of the workers whose bits changed; after many changes, take every row again from ``shared`` and
        mark the state for a walk of the rows. False: the run was dropped."""
        self._pending -= mine
        rows, width, hashes, at = run.rows, run.width, run.hashes, self._at
        if len(mine) > PATCH_MAX or run.result is None:
            again = self._native.capture_rows(hashes, shared, width, len(hashes))
            if again is None or len(again) != len(rows):  # a row left with one holder (or none), or wider
                self._drop(run)
                return False
            run.rows = again
            run.active = run.result = None
            return True
        for row in sorted(at[local][1] for local in mine):
            mask = holders.get(hashes[row], 0)
            if not mask & (mask - 1) or mask.bit_length() > 8 * width:
                self._drop(run)
                return False
            start = row * width
            old = int.from_bytes(rows[start : start + width], "little")
            if old != mask:
                rows[start : start + width] = mask.to_bytes(width, "little")
                self._redepth(run, row, mask & ~old, old & ~mask)
        return True

    def _redepth(self, run: Rows, row: int, gained: int, lost: int) -> None:
        """Row ``row`` of ``run`` gained and lost these workers: only their depths change. A worker's depth is
        the first row it does not hold (``active``: all of them; ``result``: fewer, not 0)."""
        names, n, result = self._names, len(run.hashes), run.result
        active = run.active
        assert result is not None and active is not None
        while lost:
            low = lost & -lost
            lost ^= low
            name = names[low.bit_length() - 1]
            if active & low:
                active ^= low
            elif result.get(name, 0) <= row:
                continue
            if row:
                result[name] = row
            else:
                result.pop(name, None)
        while gained:
            low = gained & -gained
            gained ^= low
            slot = low.bit_length() - 1
            name = names[slot]
            if result.get(name, 0) != row or active & low:  # a hole after its depth, or none before
                continue
            depth = self._native.scan_column(run.rows, run.width, slot, row + 1, n)
            if depth == n:
                active |= low
                result.pop(name, None)
            else:
                result[name] = depth
        run.active = active

    def _find(self, hashes: Sequence[int], shared: dict[int, int], holders: dict[int, int]) -> Rows | None:
        """The remembered run ``hashes`` starts with (or that starts with ``hashes``), its rows up to date."""
        run = self.runs.get(hashes[0])
        if run is None:
            return None
        m = min(len(hashes), len(run.hashes))
        if hashes[m - 1] != run.hashes[m - 1]:  # chained hashes: else the prompt's first m blocks are the run's
            return None
        if self._pending:
            mine = self._pending & run.keys
            if mine and not self._settle(run, mine, shared, holders):
                return None
        return run

    def overlaps(self, hashes: Sequence[int], shared: dict[int, int], holders: dict[int, int], names: list[str],
                 capture: int) -> dict[str, int]:
        """``PrefixIndex.overlaps`` without predictions (``hashes`` not empty), resuming a remembered run."""
        native = self._native
        run = self._find(hashes, shared, holders)
        if run is not None:
            m = min(len(hashes), len(run.hashes))
            if m < len(run.hashes):  # a shorter prompt: its rows say it all
                short: dict[str, int] = native.walk_rows(run.rows, m, run.width, names, True)[1]
                return short
            if run.active is None or run.result is None:
                run.active, run.result = native.walk_rows(run.rows, m, run.width, names, False)
            found: dict[str, int]
            found, caught = native.walk(hashes, shared, holders, names, (m, hashes[m - 1], run.active, run.result),
                                        capture, None, 0)
            if caught is not None:
                self._extend(run, hashes, caught, shared, holders)
            return found
        found, caught = native.walk(hashes, shared, holders, names, None, capture, None, 0)
        if caught is not None:
            width = 8 * (len(names) // 64 + 1)
            rows = native.fill_rows(hashes, 0, caught[0], shared, holders, width)
            if rows is not None:
                covered = list(hashes[: caught[0]])
                self._remember(Rows(covered, rows, width, caught[2], caught[3], set(covered)))
        return found

    def guessed(self, hashes: Sequence[int], shared: dict[int, int], holders: dict[int, int], names: list[str],
                capture: int, guesses: dict[int, int], allowed: int) -> dict[str, int] | None:
        """``PrefixIndex.overlaps`` with predictions (``guesses``: masks by router hash; ``allowed``: the workers
        whose guesses count, -1: all) over a remembered run's rows, capturing one if the prompt starts with
        ``capture`` or more blocks two or more workers hold each; None: no run, the caller walks."""
        native = self._native
        run = self._find(hashes, shared, holders)
        if run is None:
            width = 8 * (len(names) // 64 + 1)
            rows = native.capture_rows(hashes, shared, width, capture)
            if rows is None:
                return None
            n = len(rows) // width
            active, result = native.walk_rows(rows, n, width, names, False)
            run = Rows(list(hashes[:n]), rows, width, active, result, set(hashes[:n]))
            self._remember(run)
        m = min(len(hashes), len(run.hashes))
        in_rows = allowed if allowed < 0 else allowed & ((1 << 8 * run.width) - 1)  # no guess is wider (else None)
        got = native.walk_rows(run.rows, m, run.width, names, m == len(hashes), hashes, guesses, in_rows)
        if got is None:  # a guess for a slot beyond the rows
            return None
        if m == len(hashes):
            done: dict[str, int] = got[1]
            return done
        found: dict[str, int] = native.walk(hashes, shared, holders, names, (m, hashes[m - 1], got[0], got[1]), 0,
                                            guesses, allowed)[0]
        return found

    def _remember(self, run: Rows) -> None:
        if len(run.hashes) > self._watched_max or len(run.rows) > ROWS_MAX_BYTES:
            return
        first = run.hashes[0]
        old = self.runs.get(first)
        if old is not None:
            self._drop(old)
        if len(self._at) + len(run.hashes) > self._watched_max or self._bytes + len(run.rows) > ROWS_MAX_BYTES:
            self.forget()
        elif len(self.runs) >= self._runs_max:
            self._drop(next(iter(self.runs.values())))  # the oldest
        self.runs[first] = run
        self._bytes += len(run.rows)
        self._register(run, 0)

    def _extend(self, run: Rows, hashes: Sequence[int], caught: tuple[int, int, int, dict[str, int]],
                shared: dict[int, int], holders: dict[int, int]) -> None:
        """A longer prompt took the run further: rows for its blocks past the run's."""
        start, end = len(run.hashes), caught[0]
        rows = self._native.fill_rows(hashes, start, end, shared, holders, run.width)
        if rows is None or len(self._at) + end - start > self._watched_max or \
                self._bytes + len(rows) > ROWS_MAX_BYTES:
            self._drop(run)
            return
        run.rows += rows
        run.hashes += hashes[start:end]
        run.keys.update(hashes[start:end])
        run.active, run.result = caught[2], caught[3]
        self._bytes += len(rows)
        self._register(run, start)

    def _register(self, run: Rows, start: int) -> None:
        """Point rows ``start``.. of ``run`` at it; a router hash another run (or this one, twice) covers
        already drops that run (or this one: a row must have one place to patch)."""
        at = self._at
        for row in range(start, len(run.hashes)):
            local = run.hashes[row]
            hit = at.get(local)
            if hit is not None:
                self._drop(hit[0])
                if hit[0] is run:
                    return
            at[local] = (run, row)
        self._watched.update(run.hashes[start:])

    def _drop(self, run: Rows) -> None:
        first = run.hashes[0]
        at, watched, pending = self._at, self._watched, self._pending
        if self.runs.get(first) is run:
            del self.runs[first]
            self._bytes -= len(run.rows)
            if len(run.keys) == len(run.hashes):
                # a remembered run without a repeated hash is registered whole (_register drops the run it finds
                # at a row first, and a run it is registering only when that run repeats a hash): every row is
                # the run's in ``at``, so the loop below deletes them all; here in C-level passes (issue 15's
                # fourteenth round: tenants sharing a first block replace each other's ~170-row run at one
                # request in three, and the loop was ~1/6 of the pick there)
                deque(map(at.__delitem__, run.hashes), maxlen=0)
                watched.difference_update(run.keys)
                pending.difference_update(run.keys)
                return
        for local in run.hashes:
            hit = at.get(local)
            if hit is not None and hit[0] is run:
                del at[local]
                watched.discard(local)
                pending.discard(local)
