"""The index's C loops (``infera.kv._native``) against its pure-Python path: the same block hashes, the same
index state after every step of random event streams, the same overlap answers."""

from __future__ import annotations

import struct
import types
from typing import Any
from unittest.mock import patch

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv import hashing
from infera.kv.index import PrefixIndex
from infera.kv.native import ENV, load
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KvEvent

native = load()
pytestmark = pytest.mark.skipif(native is None, reason="the C extension infera.kv._native is not built")

BLOCK = 4
WORKERS = ("a", "b", "c", "d")
# Prompt 1 shares 2 blocks with prompt 0, prompt 2 repeats a block's tokens (two router hashes, same tokens).
PROMPTS = [[p * 100 + t for t in range(6 * BLOCK)] for p in range(2)]
PROMPTS[1][: 2 * BLOCK] = PROMPTS[0][: 2 * BLOCK]
PROMPTS.append([7] * (6 * BLOCK))
ROUTER = [hashing.pure_block_hashes(p, BLOCK) for p in PROMPTS]


def _engine_hash(prompt: int, depth: int, lora: int) -> int:
    """Content-addressed (the whole prefix) and per adapter: two engine blocks can share a router hash."""
    return hash((lora, tuple(PROMPTS[prompt][: (depth + 1) * BLOCK]))) & (2**64 - 1)


medium = st.sampled_from(["GPU", "GPU", "GPU", "CPU", None])
store = st.tuples(st.just("store"), st.integers(0, 2), st.integers(0, 5), st.integers(1, 6), medium, st.integers(0, 1),
                  st.booleans())
remove = st.tuples(st.just("remove"), st.integers(0, 2), st.lists(st.tuples(st.integers(0, 5), medium), min_size=1,
                                                                   max_size=3), st.integers(0, 1))
op = st.one_of(
    st.tuples(st.just("events"), st.sampled_from(WORKERS), st.lists(st.one_of(store, store, remove), min_size=1,
                                                                    max_size=5)),
    st.tuples(st.just("clear"), st.sampled_from(WORKERS)),
    st.tuples(st.just("remove_worker"), st.sampled_from(WORKERS)),
    st.tuples(st.just("predict"), st.sampled_from(WORKERS), st.integers(0, 2), st.integers(1, 6),
              st.sampled_from([0.0, 1.0, 2.5])),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 2.0])),
)


def _events(spec: list[tuple[Any, ...]]) -> list[KvEvent]:
    out: list[KvEvent] = []
    for s in spec:
        if s[0] == "store":
            _, p, start, n, med, lora, fresh = s
            end = min(6, start + n)
            parent = None if start == 0 else _engine_hash(p, start - 1, lora)
            hashes = [_engine_hash(p, j, lora) + (1 if fresh else 0) for j in range(start, end)]  # fresh: new ids
            out.append(BlockStored(hashes, parent, PROMPTS[p][start * BLOCK : end * BLOCK], BLOCK, medium=med))
        elif s[0] == "clear":
            out.append(AllBlocksCleared())
        else:
            _, p, blocks, lora = s
            out += [BlockRemoved([_engine_hash(p, j, lora)], medium=med) for j, med in blocks]
    return out


def _state(index: PrefixIndex) -> Any:
    """Everything but the remembered walks (a cache whose extent differs between the paths by design)."""
    workers = {w: (t.slot, t.bit, list(t.blocks.items()), t.media, t.extra, t.lower, t.predicted, t.orphan_blocks,
                   t.last_event_ts) for w, t in index._workers.items()}
    return (index._holders, index._shared, index._predicted, index.counters.as_dict(), index._slots.names, workers,
            sorted((e, s, w, h) for e, s, w, h in index._expiry_heap))


def _step(index: PrefixIndex, o: tuple[Any, ...], now: float) -> None:
    """One op of the random streams (``op``) on ``index``; "tick" moves the caller's clock and is not applied."""
    if o[0] == "events":
        index.apply(o[1], EventBatch(1.0, _events(o[2])), now=5.0)
    elif o[0] == "clear":
        index.apply(o[1], EventBatch(1.0, [AllBlocksCleared()]), now=5.0)
    elif o[0] == "remove_worker":
        index.remove_worker(o[1])
    elif o[0] == "predict":
        index.predict(o[1], ROUTER[o[2]][: o[3]], ttl=o[4], now=now)


@settings(max_examples=400, deadline=None)
@given(st.lists(op, max_size=40), st.sampled_from([1, 2, 64]))
def test_random_streams_give_the_same_state_and_answers(ops: list[tuple[Any, ...]], run_min: int) -> None:
    with patch("infera.kv.index.RUN_MIN_BLOCKS", run_min):
        c, py = PrefixIndex(block_size=BLOCK, native=True), PrefixIndex(block_size=BLOCK, native=False)
        assert c._native is not None and py._native is None
        now = 100.0
        for o in ops:
            for index in (c, py):
                _step(index, o, now)
            if o[0] == "tick":
                now += o[1]
            assert _state(c) == _state(py)
            for hashes in ROUTER:
                for n in (6, 3, 6):  # a longer, a shorter and the same prompt again: runs remembered and resumed
                    for use in (False, True, {"a", "c"}, set()):
                        assert c.overlaps(hashes[:n], now=now, use_predicted=use) == \
                            py.overlaps(hashes[:n], now=now, use_predicted=use), (hashes, n, use)
                    assert c.overlaps_and_confirmed(hashes[:n], now=now) == _both(py, hashes[:n], now)
            for w in WORKERS:
                assert c.cache_view(w) == py.cache_view(w)
                assert c.lower_tier_blocks(w, ROUTER[0], 6) == py.lower_tier_blocks(w, ROUTER[0], 6)


class _Stored(BlockStored):
    pass


class _Removed(BlockRemoved):
    pass


class _Cleared(AllBlocksCleared):
    pass


_SUBCLASS = {BlockStored: _Stored, BlockRemoved: _Removed, AllBlocksCleared: _Cleared}


def _as_subclass(event: KvEvent) -> KvEvent:
    """The same event as an instance of a subclass of its class (built in code by a caller that extends them)."""
    return _SUBCLASS[type(event)](*msgspec.structs.astuple(event))  # type: ignore[no-any-return]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(store, store, remove, st.just(("clear",))), max_size=12),
       st.lists(st.one_of(store, remove), max_size=6), st.booleans(), st.booleans())
def test_a_batch_applies_as_its_events_one_per_batch(spec: list[tuple[Any, ...]], other: list[tuple[Any, ...]],
                                                     c_path: bool, subclass: bool) -> None:
    """Whole batches (runs of one kind applied together) and one-event batches (no grouping) give the same
    state, on each path, with the events' exact classes or subclasses of them; another worker shares blocks."""
    events = _events(spec)
    whole, single = PrefixIndex(block_size=BLOCK, native=c_path), PrefixIndex(block_size=BLOCK, native=c_path)
    for index in (whole, single):
        index.apply("b", EventBatch(0.5, _events(other)), now=4.0)
    whole.apply("a", EventBatch(1.0, [_as_subclass(e) for e in events] if subclass else events), now=5.0)
    for event in events:
        single.apply("a", EventBatch(1.0, [event]), now=5.0)
    if not events:
        single.apply("a", EventBatch(1.0, []), now=5.0)
    assert _state(whole) == _state(single)
    assert whole.cache_view("a") == single.cache_view("a")


def _hold_staggered(index: PrefixIndex, holds: list[tuple[int, list[int]]], long: list[int]) -> None:
    """Worker ``w{k}`` stores the first ``depth`` blocks of ``long``, then evicts the blocks ``holes`` name."""
    for k, (depth, holes) in enumerate(holds):
        engine = [k * 10_000 + j for j in range(depth)]
        events: list[KvEvent] = [BlockStored(engine, None, long[: depth * BLOCK], BLOCK)] if depth else []
        events += [BlockRemoved([engine[j]]) for j in sorted(set(holes)) if j < depth]
        index.apply(f"w{k}", EventBatch(1.0, events or [AllBlocksCleared()]))


def _both(index: PrefixIndex, hashes: list[int], now: float | None = None) -> tuple[dict[str, int], int]:
    """What ``overlaps_and_confirmed`` answers, by its definition: two queries."""
    found = index.overlaps(hashes, now=now, use_predicted=True)
    return found, max(index.overlaps(hashes, now=now).values(), default=0) if found else 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 80), st.lists(st.integers(0, 79), max_size=3)), min_size=1, max_size=100),
       st.lists(st.tuples(st.integers(0, 120), st.integers(0, 80), st.integers(0, 79)), min_size=1, max_size=12),
       st.lists(st.integers(0, 80), min_size=1, max_size=4))
def test_one_walk_gives_the_predicted_and_the_confirmed_overlap(holds: list[tuple[int, list[int]]],
                                                                guesses: list[tuple[int, int, int]],
                                                                lengths: list[int]) -> None:
    """Up to 120 workers (masks of several words) holding a prompt to staggered depths with holes, predictions for
    some of them (some from a later block on, so a guess fills a hole or extends a depth): the C path's one walk
    answers what the two queries answer, on both paths."""
    long = [t % 50_000 + 1 for t in range(0, 80 * BLOCK * 7, 7)]
    hashes = hashing.pure_block_hashes(long, BLOCK)
    c, py = PrefixIndex(block_size=BLOCK, native=True), PrefixIndex(block_size=BLOCK, native=False)
    for index in (c, py):
        _hold_staggered(index, holds, long)
        for k, start, n in guesses:
            index.predict(f"w{k}", hashes[start : start + n], ttl=10.0, now=1.0)
    for n in lengths:
        want = _both(py, hashes[:n], 2.0)
        assert c.overlaps_and_confirmed(hashes[:n], now=2.0) == want
        assert py.overlaps_and_confirmed(hashes[:n], now=2.0) == want
        assert c._native is not None
        if n:
            assert c._native.walk_both(hashes[:n], c._shared, c._holders, c._slots.names, c._predicted, -1) == want
    assert c.overlaps_and_confirmed(hashes, now=20.0) == _both(py, hashes, 20.0)  # every guess expired


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.lists(st.integers(0, 299), max_size=3)), min_size=1, max_size=150),
       st.lists(st.tuples(st.integers(0, 149), st.integers(0, 299), st.booleans(), st.integers(1, 300)), max_size=10))
def test_many_holders_walk_the_same(holds: list[tuple[int, list[int]]],
                                    steps: list[tuple[int, int, bool, int]]) -> None:
    """Up to 150 workers (masks of several 64-bit words) holding a long prompt to staggered depths with holes,
    then single-block evictions and re-stores between queries of several lengths."""
    long = [t % 50_000 + 1 for t in range(0, 300 * BLOCK * 7, 7)]
    hashes = hashing.pure_block_hashes(long, BLOCK)
    c, py = PrefixIndex(block_size=BLOCK, native=True), PrefixIndex(block_size=BLOCK, native=False)
    with patch("infera.kv.index.RUN_MIN_BLOCKS", 8):
        for index in (c, py):
            _hold_staggered(index, holds, long)
        assert _state(c) == _state(py)
        for n in (300, 17, 300):
            assert c.overlaps(hashes[:n]) == py.overlaps(hashes[:n])
        for k, j, evict, n in steps:
            k %= len(holds)
            eh = k * 10_000 + j
            for index in (c, py):
                if evict:
                    index.apply(f"w{k}", EventBatch(1.0, [BlockRemoved([eh])]))
                else:
                    parent = None if j == 0 else eh - 1
                    index.apply(f"w{k}", EventBatch(1.0, [BlockStored([eh], parent, long[j * BLOCK : (j + 1) * BLOCK],
                                                                      BLOCK)]))
            assert _state(c) == _state(py)
            for m in (n, 300, n):
                assert c.overlaps(hashes[:m]) == py.overlaps(hashes[:m])
            assert c.overlaps(hashes, use_predicted=True) == py.overlaps(hashes, use_predicted=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=200), st.integers(1, 300), st.integers(0, 2**64 - 1),
       st.integers(0, 5), st.integers(0, 60))
def test_block_hashes_are_the_same(tokens: list[int], block_size: int, parent: int, first: int, n_blocks: int) -> None:
    assert native is not None
    want = hashing._chain_py(tokens, first, min(n_blocks, len(tokens) // block_size), block_size, parent)
    assert native.chain_hashes(tokens, first, n_blocks, block_size, parent) == want


def test_token_ids_outside_uint32_take_the_python_path() -> None:
    assert native is not None
    for bad in ([1, 2, 3, 2**32], [1, 2, 3, -1], [1, 2, 3, 1.5]):
        assert native.chain_hashes(bad, 0, 1, 4, 0) is None
        with pytest.raises(struct.error):
            hashing.block_hashes(bad, 4)  # type: ignore[arg-type]
    # a block size above the C loop's stack buffer
    tokens = list(range(1000))
    assert native.chain_hashes(tokens, 0, 2, 500, 9) == hashing._chain_py(tokens, 0, 2, 500, 9)


def test_the_environment_forces_the_pure_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")
    assert load() is None and PrefixIndex()._native is None
    assert PrefixIndex(native=True)._native is native  # asked for explicitly
    monkeypatch.setenv(ENV, "0")
    assert load() is native and PrefixIndex()._native is native


def test_hashes_in_tuples_work_on_both_paths() -> None:
    tokens = list(range(16))
    for index in (PrefixIndex(native=True), PrefixIndex(native=False)):
        index.apply("w", EventBatch(1.0, [BlockStored((1, 2, 3, 4), None, tokens, 4)]))  # type: ignore[arg-type]
        index.apply("w", EventBatch(1.0, [BlockRemoved((4,))]))  # type: ignore[arg-type]
        assert index.overlaps(hashing.pure_block_hashes(tokens, 4)) == {"w": 3}


LONG = 24  # blocks of each prompt below
# Prompts 0 and 1 share their first 6 blocks (one remembered run each time, by first router hash, replaced by the
# other's), prompt 2 shares nothing.
HOT = [[p * 10_000 + t for t in range(LONG * BLOCK)] for p in range(3)]
HOT[1][: 6 * BLOCK] = HOT[0][: 6 * BLOCK]
HOT_ROUTER = [hashing.pure_block_hashes(p, BLOCK) for p in HOT]

hot_op = st.one_of(
    st.tuples(st.just("store"), st.integers(0, 79), st.integers(0, 2), st.integers(0, LONG - 1), st.integers(1, LONG)),
    st.tuples(st.just("remove"), st.integers(0, 79), st.integers(0, 2), st.integers(0, LONG - 1)),
    st.tuples(st.just("remove_worker"), st.integers(0, 79)),
    st.tuples(st.just("clear"), st.integers(0, 79)),
    st.tuples(st.just("query"), st.integers(0, 2), st.integers(1, LONG)),
    st.tuples(st.just("predict"), st.integers(0, 79), st.integers(0, 2), st.integers(1, LONG), st.booleans()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, LONG), st.integers(0, LONG)), min_size=2, max_size=70),
       st.lists(hot_op, max_size=40), st.sampled_from([1, 3, 8]))
def test_remembered_rows_are_patched_exactly(holds: list[tuple[int, int]], ops: list[tuple[Any, ...]],
                                             run_min: int) -> None:
    """The C path keeps a hot prefix's masks as rows and patches them (and the workers' depths) on every change:
    many workers holding two prompts that share a prefix to staggered depths, then stores that fill holes or extend,
    single-block evictions, cleared and removed workers (slots reused), new workers whose slots lie beyond the rows'
    width, queries of every length between the changes (runs captured, extended, replaced, walked shorter), with
    and without predictions (some expiring)."""

    def engine(k: int, p: int, j: int) -> int:
        return k * 1000 + p * 100 + j

    def stored(k: int, p: int, start: int, n: int) -> BlockStored:
        end = min(LONG, start + n)
        parent = None if start == 0 else engine(k, p, start - 1)
        return BlockStored([engine(k, p, j) for j in range(start, end)], parent, HOT[p][start * BLOCK : end * BLOCK],
                           BLOCK)

    c, py = PrefixIndex(block_size=BLOCK, native=True), PrefixIndex(block_size=BLOCK, native=False)
    now = 10.0
    with patch("infera.kv.index.RUN_MIN_BLOCKS", run_min):
        for index in (c, py):
            for k, (d0, d1) in enumerate(holds):
                events: list[KvEvent] = [stored(k, p, 0, d) for p, d in ((0, d0), (1, d1)) if d]
                index.apply(f"w{k}", EventBatch(1.0, events or [AllBlocksCleared()]))
        for o in [("query", 0, LONG), *ops]:
            for index in (c, py):
                if o[0] == "store":
                    index.apply(f"w{o[1]}", EventBatch(1.0, [stored(*o[1:])]))
                elif o[0] == "remove":
                    index.apply(f"w{o[1]}", EventBatch(1.0, [BlockRemoved([engine(*o[1:])])]))
                elif o[0] == "remove_worker":
                    index.remove_worker(f"w{o[1]}")
                elif o[0] == "clear":
                    index.apply(f"w{o[1]}", EventBatch(1.0, [AllBlocksCleared()]))
                elif o[0] == "predict":
                    index.predict(f"w{o[1]}", HOT_ROUTER[o[2]][: o[3]], ttl=1.0 if o[4] else 100.0, now=now)
            if o[0] == "query":
                assert c.overlaps(HOT_ROUTER[o[1]][: o[2]]) == py.overlaps(HOT_ROUTER[o[1]][: o[2]])
                continue
            if o[0] == "predict":
                now += 0.6  # a short prediction lives one more step
            assert _state(c) == _state(py)
            for hashes in HOT_ROUTER:
                for n in (LONG, 5, LONG):
                    assert c.overlaps(hashes[:n]) == py.overlaps(hashes[:n]), (hashes[0], n)
                    for use in (True, {"w1", "w3", "w70"}):
                        assert c.overlaps(hashes[:n], now=now, use_predicted=use) == \
                            py.overlaps(hashes[:n], now=now, use_predicted=use), (hashes[0], n, use)
        assert c._rows is not None
        rows = c._rows
        for run in list(rows.runs.values()):
            c.overlaps(run.hashes)  # patches the rows noted since the last query
        for run in rows.runs.values():  # every remembered row is the index's mask, and every one is watched
            assert rows._pending.isdisjoint(run.keys) and run.keys == set(run.hashes)
            for r, local in enumerate(run.hashes):
                assert int.from_bytes(run.rows[r * run.width : (r + 1) * run.width], "little") == \
                    c._holders.get(local, 0)
            assert c._watched.issuperset(run.hashes)


def _hot_pair() -> tuple[PrefixIndex, PrefixIndex]:
    return PrefixIndex(block_size=BLOCK, native=True), PrefixIndex(block_size=BLOCK, native=False)


def _hold(index: PrefixIndex, worker: str, depth: int, first_engine: int = 0) -> None:
    hashes = list(range(first_engine, first_engine + depth))
    index.apply(worker, EventBatch(1.0, [BlockStored(hashes, None, HOT[0][: depth * BLOCK], BLOCK)]))


def test_a_row_left_with_one_holder_drops_its_run() -> None:
    """Changes to a mask with fewer than two holders go unreported (store and removal watch shared masks only):
    the run of a row that falls to one holder is forgotten, not patched, so it cannot go stale."""
    c, py = _hot_pair()
    with patch("infera.kv.index.RUN_MIN_BLOCKS", 4):
        for index in (c, py):
            _hold(index, "a", LONG)
            _hold(index, "b", LONG, 100)
        assert c.overlaps(HOT_ROUTER[0]) == py.overlaps(HOT_ROUTER[0]) == {"a": LONG, "b": LONG}
        assert c._rows is not None and len(c._rows.runs) == 1
        for worker, engine in (("a", 10), ("b", 110), ("a", 11)):  # row 10: two holders, one, none
            for index in (c, py):
                index.apply(worker, EventBatch(1.0, [BlockRemoved([engine])]))
            for n in (LONG, 12, 9):
                assert c.overlaps(HOT_ROUTER[0][:n]) == py.overlaps(HOT_ROUTER[0][:n])
        assert c.overlaps(HOT_ROUTER[0]) == {"a": 10, "b": 10}
        for index in (c, py):  # back to two holders of row 10: b re-stores it
            index.apply("b", EventBatch(1.0, [BlockStored([110], 109, HOT[0][10 * BLOCK : 11 * BLOCK], BLOCK)]))
        assert c.overlaps(HOT_ROUTER[0]) == py.overlaps(HOT_ROUTER[0]) == {"a": 10, "b": LONG}


def test_a_worker_beyond_the_rows_width_recaptures_the_run() -> None:
    """Rows are as wide as the fleet at capture plus up to 64 slots; a worker with a slot beyond that holding one
    of the run's blocks forgets the run, and the next query captures it again, wider."""
    c, py = _hot_pair()
    with patch("infera.kv.index.RUN_MIN_BLOCKS", 4):
        for k in range(3):
            for index in (c, py):
                _hold(index, f"w{k}", LONG - k, 1000 * k)
        assert c.overlaps(HOT_ROUTER[0]) == py.overlaps(HOT_ROUTER[0])
        assert c._rows is not None
        width = c._rows.runs[HOT_ROUTER[0][0]].width
        assert width == 8
        for k in range(3, 70):  # slots 3..69: from slot 64 on the 8-byte rows cannot hold the mask
            for index in (c, py):
                _hold(index, f"w{k}", 1 + k % LONG, 1000 * k)
            assert c.overlaps(HOT_ROUTER[0]) == py.overlaps(HOT_ROUTER[0])
            assert c.overlaps(HOT_ROUTER[0][:3]) == py.overlaps(HOT_ROUTER[0][:3])
        assert c._rows.runs[HOT_ROUTER[0][0]].width == 16


def test_a_removed_workers_slot_taken_by_another_between_queries() -> None:
    """Row changes are patched at the next query, by the names the slots have then: a worker removed (its slot freed,
    then taken by a newcomer) between two queries must leave no trace in the answer."""
    c, py = _hot_pair()
    with patch("infera.kv.index.RUN_MIN_BLOCKS", 4):
        for index in (c, py):
            for k in range(3):
                _hold(index, f"w{k}", LONG, 1000 * k)
            _hold(index, "small", 3, 5000)
        assert c.overlaps(HOT_ROUTER[0]) == py.overlaps(HOT_ROUTER[0])
        for index in (c, py):
            index.remove_worker("small")
        assert c.overlaps(HOT_ROUTER[0]) == py.overlaps(HOT_ROUTER[0]) == {f"w{k}": LONG for k in range(3)}
        for index in (c, py):
            index.remove_worker("w1")
            _hold(index, "new", 2, 6000)  # takes w1's slot
        assert c.overlaps(HOT_ROUTER[0]) == py.overlaps(HOT_ROUTER[0]) == {"w0": LONG, "w2": LONG, "new": 2}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 9), st.integers(20, 120))
def test_tables_in_c_match_dicts_through_growth_and_eviction(seed: int, n_workers: int, steps: int) -> None:
    """The C path's tables (``U64Map``: engine hash -> router hash per worker, router hash -> holders) against the
    pure path's dicts on streams long enough to grow them through several resizes and to shift probe runs on
    eviction: workers store long prompts of a small shared pool (new blocks only, or the whole prompt again under
    fresh engine hashes), evict random blocks, clear, and the index answers every prompt between steps."""
    import random

    rng = random.Random(seed)
    size = 4
    pool = [[rng.randrange(2**32) for _ in range(size * rng.randint(1, 160))] for _ in range(6)]
    pool[1][: size * 40] = pool[0][: size * 40]  # a shared prefix
    router = [hashing.pure_block_hashes(p, size) for p in pool]
    c, py = PrefixIndex(block_size=size, native=True), PrefixIndex(block_size=size, native=False)
    held: dict[str, list[int]] = {}
    for _ in range(steps):
        w = f"w{rng.randrange(n_workers)}"
        roll = rng.random()
        events: list[KvEvent]
        if roll < 0.55:
            p = rng.randrange(len(pool))
            n = len(router[p])
            hashes = [rng.randrange(2**64) for _ in range(n)]
            events = [BlockStored(hashes, None, pool[p], size, medium="GPU")]
            held.setdefault(w, []).extend(hashes)
        elif roll < 0.93:
            mine = held.get(w, [])
            gone = [mine.pop(rng.randrange(len(mine))) for _ in range(min(len(mine), rng.randint(1, 90)))]
            gone.append(rng.randrange(2**64))  # one the worker never held
            events = [BlockRemoved([h], medium="GPU") for h in gone]
        else:
            held.pop(w, None)
            events = [AllBlocksCleared()]
        for index in (c, py):
            index.apply(w, EventBatch(1.0, events), now=5.0)
        assert _state(c) == _state(py)
        for hashes in router:
            for n in (len(hashes), len(hashes) // 2 + 1):
                assert c.overlaps(hashes[:n]) == py.overlaps(hashes[:n])
    assert type(c._holders) is native.U64Map and all(type(t.blocks) is native.U64Map for t in c._workers.values())
    assert type(py._holders) is dict
    for w in list(c._workers):
        assert c.cache_view(w) == py.cache_view(w)
        c.remove_worker(w)
        py.remove_worker(w)
        assert _state(c) == _state(py)
    assert len(c._holders) == 0


def test_removing_one_of_two_engine_blocks_with_the_same_tokens_keeps_the_block() -> None:
    """The C removal's fast path (a block the worker alone holds) must not take a router hash another engine block of
    the same worker still holds (two adapters over the same tokens): the worker keeps it, as in pure Python."""
    tokens = list(range(2 * BLOCK))
    answers = []
    for flag in (True, False):
        index = PrefixIndex(block_size=BLOCK, native=flag)
        index.apply("a", EventBatch(1.0, [BlockStored([1, 2], None, tokens, BLOCK),
                                          BlockStored([11, 12], None, tokens, BLOCK)]))
        index.apply("a", EventBatch(1.0, [BlockRemoved([1]), BlockRemoved([2])]))
        answers.append((_state(index), index.overlaps(hashing.pure_block_hashes(tokens, BLOCK))))
    assert answers[0] == answers[1]
    assert answers[0][1] == {"a": 2}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.lists(st.integers(0, 2**64 - 1), max_size=3),
                          st.integers(0, 12)), max_size=40))
def test_load_tickets_count_blocks_the_same(steps: list[tuple[bool, int, list[int], int]]) -> None:
    """LoadTracker's block references in C (``refs_add``/``refs_release``) against Python's: the same counts and
    the same distinct blocks per worker after every begin and end, shared prefixes and repeated hashes included."""
    import infera.kv.load as load_module
    from infera.kv import _native as native
    from infera.kv.load import LoadTracker

    c, py = LoadTracker(clock=lambda: 1.0, native=True), LoadTracker(clock=lambda: 1.0, native=False)
    # an extension built before load_refs_add (issue 15's ninth round): the dict and refs_add / refs_release
    stale_native = types.SimpleNamespace(**{k: getattr(native, k) for k in dir(native) if not k.startswith("load_")})
    with patch.object(load_module, "choose", lambda _: stale_native):
        stale = LoadTracker(clock=lambda: 1.0, native=True)
    assert c._native is not None and py._native is None and not stale._map_refs and c._map_refs
    trackers = (c, stale, py)
    pool = [h for prompt in ROUTER for h in prompt]
    open_: list[tuple[Any, ...]] = []
    for begin, worker, extra, pick in steps:
        if begin or not open_:
            hashes = [*pool[pick: pick + 6], *extra]
            open_.append(tuple(t.begin(WORKERS[worker], 10, hashes, 1) for t in trackers))
        else:
            tickets = open_.pop(pick % len(open_))
            for load, ticket in zip(trackers, tickets, strict=True):
                load.end(ticket)
                load.end(ticket)  # idempotent
        for w in WORKERS:
            assert c.active_blocks(w) == stale.active_blocks(w) == py.active_blocks(w)
            refs = [load._load[w].block_refs if w in load._load else None for load in trackers]
            assert isinstance(refs[1], (dict, type(None))) and isinstance(refs[2], (dict, type(None)))
            assert refs[0] == refs[1] == refs[2]
            if refs[0] is not None:
                assert isinstance(refs[0], native.U64Map)
                assert refs[0].as_dict() == refs[2]


def test_load_refs_release_of_an_unheld_hash_is_a_key_error() -> None:
    """The C map's release raises as the dict's ``refs[h]`` does, and a key that is no u64 is refused."""
    from infera.kv import _native as native

    refs = native.U64Map(False)
    native.load_refs_add(refs, [5, 5, 7])
    assert refs.as_dict() == {5: 2, 7: 1}
    with pytest.raises(KeyError):
        native.load_refs_release(refs, [9])
    with pytest.raises(OverflowError):
        native.load_refs_add(refs, [-1])
    with pytest.raises(TypeError):
        native.load_refs_add({}, [1])
    native.load_refs_release(refs, [5, 7, 5])
    assert len(refs) == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_holding_is_the_one_block_overlap_query(ops: list[tuple[Any, ...]]) -> None:
    """``holding(block)`` (kv-aware's recency shadow asks it per request) names the workers of
    ``overlaps([block], use_predicted=True)`` in the same order, on both paths, after every step of a random stream."""
    c, py = PrefixIndex(block_size=BLOCK, native=True), PrefixIndex(block_size=BLOCK, native=False)
    now = 100.0
    for o in ops:
        for index in (c, py):
            _step(index, o, now)
        if o[0] == "tick":
            now += o[1]
        for block in [h for hashes in ROUTER for h in hashes] + [12345]:
            got = c.holding(block, now=now)
            assert got == py.holding(block, now=now)
            assert got == list(py.overlaps([block], now=now, use_predicted=True)) == \
                list(c.overlaps([block], now=now, use_predicted=True)), (block, o)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 80), st.lists(st.integers(0, 79), max_size=3)), min_size=1, max_size=100),
       st.lists(st.tuples(st.integers(0, 120), st.integers(0, 80), st.integers(0, 79)), max_size=12),
       st.integers(0, 79))
def test_holding_names_many_workers_in_slot_order(holds: list[tuple[int, list[int]]],
                                                  guesses: list[tuple[int, int, int]], at: int) -> None:
    """Up to 120 workers (masks of several words), confirmed with holes and predicted: the same names and order as
    the one-block overlap query."""
    long = [t % 50_000 + 1 for t in range(0, 80 * BLOCK * 7, 7)]
    hashes = hashing.pure_block_hashes(long, BLOCK)
    for native in (True, False):
        index = PrefixIndex(block_size=BLOCK, native=native)
        _hold_staggered(index, holds, long)
        for k, start, n in guesses:
            index.predict(f"w{k}", hashes[start : start + n], ttl=10.0, now=1.0)
        assert index.holding(hashes[at], now=2.0) == list(index.overlaps([hashes[at]], now=2.0, use_predicted=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_every_shared_mask_is_also_the_holders_mask(ops: list[tuple[Any, ...]]) -> None:
    """``walk_both`` (kv-aware's walk) reads a block's mask from the holders table alone on the C path: every entry of
    the shared table must be there with the same mask, on both paths, after every step of a random stream (stores,
    removals, one router hash behind several engine blocks, clears, workers leaving); and its answers stay those of
    ``overlaps`` with and without the predictions. The workers' prediction expiries (a U64Map on the C path,
    ``predict_map_add``; dicts in Python and in a build without it) give the same state on the three."""
    c, py = PrefixIndex(block_size=BLOCK, native=True), PrefixIndex(block_size=BLOCK, native=False)
    # and an extension built before predict_map_add: the workers' expiries in dicts, predict_add
    stale = PrefixIndex(block_size=BLOCK, native=True)
    stale._guesses.map_add = None
    now = 100.0
    for o in ops:
        for index in (c, py, stale):
            _step(index, o, now)
        if o[0] == "tick":
            now += o[1]
        assert _state(c) == _state(py) == _state(stale), o
        assert all(isinstance(t.predicted, type(c._native.U64Map(True))) for t in c._workers.values())
        assert all(type(t.predicted) is dict for index in (py, stale) for t in index._workers.values())
        for index in (c, py):
            assert all(index._holders.get(k) == v for k, v in index._shared.items()), o
        for hashes in ROUTER:  # (each index is asked the same: a query prunes expired predictions)
            got = c.overlaps_and_confirmed(hashes, now=now)
            assert stale.overlaps_and_confirmed(hashes, now=now) == got
            want = py.overlaps(hashes, now=now, use_predicted=True)
            assert got == (want, max(py.overlaps(hashes, now=now).values(), default=0) if want else 0), o


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 40), max_size=8), st.sampled_from([1, 2, 4]),
                          st.sampled_from([1.0, 2.0, 2.0, 3.0])), max_size=30))
def test_predict_map_add_is_predict_add(steps: list[tuple[list[int], int, float]]) -> None:
    """``predict_map_add`` (the expiries in a U64Map(True)) against ``predict_add`` (a dict): the same fresh hashes,
    expiries and masks after every call, repeated hashes, earlier and equal expiries and other workers' bits
    included."""
    from infera.kv import _native as native

    d: dict[int, float] = {}
    m = native.U64Map(True)
    dm: dict[int, int] = {}
    mm: dict[int, int] = {}
    for hashes, bit, expiry in steps:
        want = native.predict_add(d, dm, bit, hashes, expiry)
        assert native.predict_map_add(m, mm, bit, hashes, expiry) == want
        assert m == d and mm == dm and list(m.keys()) == list(d)
    with pytest.raises(OverflowError):
        native.predict_map_add(m, mm, 1, [-1], 1.0)
