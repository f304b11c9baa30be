"""A cleared worker (AllBlocksCleared, or the worker removed) leaves the index as if nothing before the clear had
happened to it: after random stores, removals, predictions and clears on workers that share blocks (lower tiers,
router hashes behind two engine blocks), the index answers every query as one built from scratch with only the
events that survive each worker's last clear. On both paths (the C path clears in csrc/index_clear.c)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.hashing import pure_block_hashes
from infera.kv.index import PrefixIndex
from infera.kv.native import load
from infera.protocols.kv_events import AllBlocksCleared, BlockStored, EventBatch, KvEvent
from tests.kv.test_native import BLOCK, ROUTER, WORKERS, _events, remove, store

PATHS = [False, True] if load() is not None else [False]
NOW = 100.0
# a worker's op: ("events", worker, specs) with clears among its events, ("clear", worker), ("remove_worker", worker),
# ("predict", worker, prompt, blocks, ttl)
op = st.one_of(
    st.tuples(st.just("events"), st.sampled_from(WORKERS),
              st.lists(st.one_of(store, store, store, remove, st.just(("clear",))), min_size=1, max_size=6)),
    st.tuples(st.just("clear"), st.sampled_from(WORKERS)),
    st.tuples(st.just("remove_worker"), st.sampled_from(WORKERS)),
    st.tuples(st.just("predict"), st.sampled_from(WORKERS), st.integers(0, 2), st.integers(1, 6),
              st.sampled_from([1.0, 50.0])),
)


def _apply(index: PrefixIndex, o: tuple[Any, ...], events: list[KvEvent] | None = None) -> None:
    if o[0] == "events":
        index.apply(o[1], EventBatch(1.0, _events(o[2]) if events is None else events), now=5.0)
    elif o[0] == "clear":
        index.apply(o[1], EventBatch(1.0, [AllBlocksCleared()]), now=5.0)
    elif o[0] == "remove_worker":
        index.remove_worker(o[1])
    else:
        index.predict(o[1], ROUTER[o[2]][: o[3]], ttl=o[4], now=NOW)


def _from_scratch(ops: list[tuple[Any, ...]], native: bool) -> PrefixIndex:
    """Each worker's ops after its last clear (or removal), in the same order; a clear that ends a batch's
    earlier events is applied (as the first event of what is left of the batch) so that the worker exists."""
    last: dict[str, tuple[int, int]] = {}  # worker -> (op, event) of its last clear; event -1: a whole op
    for i, o in enumerate(ops):
        if o[0] in ("clear", "remove_worker"):
            last[o[1]] = (i, -1)
        elif o[0] == "events":
            events = _events(o[2])
            cleared = [k for k, e in enumerate(events) if isinstance(e, AllBlocksCleared)]
            if cleared:
                last[o[1]] = (i, cleared[-1])
    index = PrefixIndex(block_size=BLOCK, native=native)
    for i, o in enumerate(ops):
        at, k = last.get(o[1], (-1, -1))
        if i < at or (i == at and o[0] == "remove_worker") or (i == at and o[0] == "predict"):
            continue
        if i == at and o[0] == "events":
            _apply(index, o, _events(o[2])[k:])
        else:
            _apply(index, o)
    return index


def _answers(index: PrefixIndex) -> Any:
    """Every query's answer, by worker name (slots may differ), and the shared and predicted tables by name."""
    names = index._slots.names

    def named(mask: int) -> frozenset[str]:
        return frozenset(names[s] for s in range(mask.bit_length()) if mask >> s & 1)

    out: list[Any] = [index.workers()]
    for hashes in ROUTER:
        for n in range(1, len(hashes) + 1):
            for use in (False, True, {"a", "c"}):
                out.append(index.overlaps(hashes[:n], now=NOW, use_predicted=use))
            out.append(index.overlaps_and_confirmed(hashes[:n], now=NOW))
        for block in hashes:
            out.append(sorted(index.holding(block, now=NOW)))
            out.append(named(index._holders.get(block, 0)))
    for w in WORKERS:
        view = index.cache_view(w)
        view.pop("orphan_blocks")  # (a total since start: a clear does not undo a skipped store)
        out += [view, index.block_count(w), index.held(w)]
        out += [index.lower_tier_blocks(w, hashes, len(hashes)) for hashes in ROUTER]
    out.append({h: named(m) for h, m in index._shared.items()})
    out.append({h: named(m) for h, m in index._predicted.items()})
    out.append(sorted(index._holders.keys()))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(op, max_size=30), st.sampled_from(PATHS))
def test_an_index_after_clears_answers_as_one_built_from_the_surviving_events(ops: list[tuple[Any, ...]],
                                                                              native: bool) -> None:
    index = PrefixIndex(block_size=BLOCK, native=native)
    for o in ops:
        _apply(index, o)
    assert _answers(index) == _answers(_from_scratch(ops, native))


def test_a_clear_of_shared_blocks_hands_the_remembered_walks_their_changed_rows() -> None:
    """Three workers hold a long prefix; one clears: the remembered walk over it (C: rows, patched) answers as a
    fresh index does, and again after a second clear leaves the prefix with one holder."""
    long = list(range(200 * BLOCK))
    for native in PATHS:
        index = PrefixIndex(block_size=BLOCK, native=native)
        fresh = PrefixIndex(block_size=BLOCK, native=native)
        hashes = pure_block_hashes(long, BLOCK)
        for k, w in enumerate(("a", "b", "c")):
            index.apply(w, EventBatch(1.0, [BlockStored([k * 1000 + j for j in range(200)], None, long, BLOCK)]))
        for w in ("a", "c"):
            fresh.apply(w, EventBatch(1.0, [BlockStored([j for j in range(200)], None, long, BLOCK)]))
        assert index.overlaps(hashes) == {"a": 200, "b": 200, "c": 200}
        assert index.overlaps(hashes) == {"a": 200, "b": 200, "c": 200}  # resumed from the remembered walk
        index.apply("b", EventBatch(1.0, [AllBlocksCleared()]))
        assert index.overlaps(hashes) == fresh.overlaps(hashes) == {"a": 200, "c": 200}
        index.apply("a", EventBatch(1.0, [AllBlocksCleared()]))
        assert index.overlaps(hashes) == {"c": 200}
        assert index._shared == {}
