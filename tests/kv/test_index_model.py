"""PrefixIndex on random event streams against a simple model, and against the index before issue 15.

The model keeps, per worker, engine hash -> (router hash, tiers) and router hash -> prediction
expiry, and answers every question by brute force. The frozen pre-issue-15 index
(``bench/index_v1.py``) checks the finer points the model leaves out (lower-tier credit with
several engine blocks per router hash, cache views, counters) exactly as they were.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.index_v1 import PrefixIndex as OldIndex
from bench.index_v2 import PrefixIndex as BeforeIndex
from infera.kv.hashing import block_hashes
from infera.kv.index import TOP_MEDIA, PrefixIndex
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KvEvent

pytestmark = pytest.mark.usefixtures("index_path")  # pure Python and C (tests/kv/conftest.py)

BLOCK = 4
WORKERS = ("a", "b")
PROMPTS = [
    [p * 100 + t for t in range(4 * BLOCK)] for p in range(2)
] + [list(range(2 * BLOCK)) + [999] * (2 * BLOCK)]  # shares its first 2 blocks with prompt 0
ROUTER = [block_hashes(p, BLOCK) for p in PROMPTS]


def _engine_hash(prompt: int, depth: int, lora: int) -> int:
    """Content-addressed like vLLM's (the whole prefix), and per adapter: two engine blocks, one router hash."""
    return hash((lora, tuple(PROMPTS[prompt][: (depth + 1) * BLOCK]))) & (2**64 - 1)


class Model:
    def __init__(self) -> None:
        self.blocks: dict[str, dict[int, tuple[int, list[str | None]]]] = {}
        self.predicted: dict[str, dict[int, float]] = {}

    def _w(self, w: str) -> dict[int, tuple[int, list[str | None]]]:
        self.predicted.setdefault(w, {})
        return self.blocks.setdefault(w, {})

    def apply(self, w: str, events: list[KvEvent]) -> None:
        held = self._w(w)
        for ev in events:
            if isinstance(ev, BlockStored):
                parent = 0
                if ev.parent_block_hash is not None:
                    if ev.parent_block_hash not in held:
                        continue
                    parent = held[ev.parent_block_hash][0]
                for eh, local in zip(ev.block_hashes, block_hashes(ev.token_ids, BLOCK, parent), strict=False):
                    if eh in held:
                        if ev.medium not in held[eh][1]:
                            held[eh][1].append(ev.medium)
                    else:
                        held[eh] = (local, [ev.medium])
                        self.predicted[w].pop(local, None)
            elif isinstance(ev, BlockRemoved):
                for eh in ev.block_hashes:
                    if eh not in held:
                        continue
                    local, media = held[eh]
                    media.remove(ev.medium) if ev.medium in media else media.clear()
                    if not media:
                        del held[eh]
                        if all(v[0] != local for v in held.values()):
                            self.predicted[w].pop(local, None)
            else:
                held.clear()
                self.predicted[w].clear()

    def remove_worker(self, w: str) -> None:
        self.blocks.pop(w, None)
        self.predicted.pop(w, None)

    def prune(self, now: float) -> None:
        for guesses in self.predicted.values():
            for local in [k for k, v in guesses.items() if v <= now]:
                del guesses[local]

    def predict(self, w: str, hashes: list[int], ttl: float, now: float) -> None:
        self.prune(now)
        self._w(w)
        for local in hashes if ttl > 0 else []:
            self.predicted[w][local] = max(self.predicted[w].get(local, -1.0), now + ttl)

    def overlaps(self, hashes: list[int], now: float, use_predicted: bool | set[str]) -> dict[str, int]:
        if use_predicted is not False:
            self.prune(now)
        out = {}
        for w, held in self.blocks.items():
            locals_ = {v[0] for v in held.values()}
            if use_predicted is True or (use_predicted is not False and w in use_predicted):
                locals_ |= set(self.predicted[w])
            n = 0
            while n < len(hashes) and hashes[n] in locals_:
                n += 1
            if n:
                out[w] = n
        return out

    def lower_tiers(self, w: str, hashes: list[int], count: int) -> dict[str, int]:
        """With one engine block per router hash: the blocks whose every tier is below the device."""
        media_of = {local: media for local, media in self.blocks.get(w, {}).values()}
        out: dict[str, int] = {}
        for local in hashes[:count]:
            media = media_of.get(local)
            if media and all(m not in TOP_MEDIA for m in media):
                out[str(media[0])] = out.get(str(media[0]), 0) + 1
        return out


medium = st.sampled_from(["GPU", "GPU", "CPU", None])
store = st.tuples(st.just("store"), st.integers(0, 2), st.integers(0, 3), st.integers(1, 4), medium, st.integers(0, 1))
remove = st.tuples(st.just("remove"), st.integers(0, 2), st.integers(0, 3), medium, st.integers(0, 1))
op = st.one_of(
    st.tuples(st.just("events"), st.sampled_from(WORKERS), st.lists(st.one_of(store, remove), min_size=1, max_size=4)),
    st.tuples(st.just("events"), st.sampled_from(WORKERS), st.lists(st.one_of(store, remove), min_size=1, max_size=4)),
    st.tuples(st.just("clear"), st.sampled_from(WORKERS)),
    st.tuples(st.just("remove_worker"), st.sampled_from(WORKERS)),
    st.tuples(st.just("predict"), st.sampled_from(WORKERS), st.integers(0, 2), st.integers(1, 4),
              st.sampled_from([0.0, 1.0, 2.5, 2.5, 5.0])),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 2.0])),
)


def _events(spec: list[tuple[Any, ...]]) -> list[KvEvent]:
    out: list[KvEvent] = []
    for s in spec:
        if s[0] == "store":
            _, p, start, n, med, lora = s
            end = min(4, start + n)
            parent = None if start == 0 else _engine_hash(p, start - 1, lora)
            out.append(BlockStored([_engine_hash(p, j, lora) for j in range(start, end)], parent,
                                   PROMPTS[p][start * BLOCK : end * BLOCK], BLOCK, medium=med))
        else:
            _, p, j, med, lora = s
            out.append(BlockRemoved([_engine_hash(p, j, lora)], medium=med))
    return out


@settings(max_examples=500, deadline=None)
@given(st.lists(op, max_size=40))
def test_random_streams_match_the_model_and_the_old_index(ops: list[tuple[Any, ...]]) -> None:
    # Every query walks in chunks (not block by block) and remembers its run: resumed, extended, forgotten.
    with patch("infera.kv.index.RUN_MIN_BLOCKS", 1), patch("infera.kv.bitmasks._FEW", 0):
        _random_stream(ops)


def _random_stream(ops: list[tuple[Any, ...]]) -> None:
    new, old, model = PrefixIndex(block_size=BLOCK), OldIndex(block_size=BLOCK), Model()
    before = BeforeIndex(block_size=BLOCK)  # main 2d3553e: the same state, tier for tier
    now = 100.0
    for o in ops:
        w = o[1] if o[0] != "tick" else ""
        if o[0] == "events":
            batch = EventBatch(1.0, _events(o[2]))
            for index in (new, old, before):
                index.apply(w, batch, now=5.0)
            model.apply(w, batch.events)
        elif o[0] == "clear":
            for index in (new, old, before):
                index.apply(w, EventBatch(1.0, [AllBlocksCleared()]), now=5.0)
            model.apply(w, [AllBlocksCleared()])
        elif o[0] == "remove_worker":
            for index in (new, old, before):
                index.remove_worker(w)
            model.remove_worker(w)
        elif o[0] == "predict":
            hashes = ROUTER[o[2]][: o[3]]
            for index in (new, old, before):
                index.predict(w, hashes, ttl=o[4], now=now)
            model.predict(w, hashes, o[4], now)
        else:
            now += o[1]
        assert new.workers() == old.workers() == sorted(model.blocks)
        for wid in (*WORKERS, "c"):
            assert new.block_count(wid) == old.block_count(wid) == len(model.blocks.get(wid, {}))
            view = new.cache_view(wid)
            assert view == old.cache_view(wid)
            assert view["predicted_blocks"] == len(model.predicted.get(wid, {}))
        assert new.counters.as_dict() == old.counters.as_dict()
        assert new._shared == {h: m for h, m in new._holders.items() if m.bit_count() > 1}
        assert new._holders == before._holders and new.counters.as_dict() == before.counters.as_dict()
        for wid in (*WORKERS, "c"):
            assert new.cache_view(wid) == before.cache_view(wid)
            assert new.lower_tier_blocks(wid, ROUTER[0], 4) == before.lower_tier_blocks(wid, ROUTER[0], 4)
        for hashes in ROUTER:
            for use in (False, True, {"a"}, set()):
                want = model.overlaps(hashes, now, use)
                assert new.overlaps(hashes, now=now, use_predicted=use) == want, (hashes, use)
                assert before.overlaps(hashes, now=now, use_predicted=use) == want
                assert old.overlaps(hashes, now=now, use_predicted=use) == want
            for wid, count in new.overlaps(hashes, now=now).items():
                lower = new.lower_tier_blocks(wid, hashes, count)
                # Not compared with the old index: it kept a shared router hash "on the device" after its
                # device copy went and only a lower-tier copy under another engine hash was left.
                if len({eh for eh in model.blocks[wid]}) == len({v[0] for v in model.blocks[wid].values()}):
                    assert lower == model.lower_tiers(wid, hashes, count)


def test_a_freed_slot_serves_a_new_worker_without_stale_bits() -> None:
    index = PrefixIndex()
    tokens = list(range(16))
    for w in ("a", "b", "c"):
        index.apply(w, EventBatch(1.0, [BlockStored([1, 2, 3, 4], None, tokens, 4)]))
    index.predict("b", block_hashes(tokens, 4), ttl=10.0, now=0.0)
    index.remove_worker("b")
    index.apply("d", EventBatch(1.0, [BlockStored([9], None, tokens[:4], 4)]))  # takes b's slot
    assert index.overlaps(block_hashes(tokens, 4), now=1.0, use_predicted=True) == {"a": 4, "c": 4, "d": 1}


def test_overlaps_with_a_thousand_holders() -> None:
    index = PrefixIndex()
    tokens = list(range(64))
    hashes = block_hashes(tokens, 4)
    for k in range(1000):
        depth = 1 + k % 16
        index.apply(f"w{k}", EventBatch(1.0, [BlockStored(list(range(depth)), None, tokens[: depth * 4], 4)]))
    found = index.overlaps(hashes)
    assert found == {f"w{k}": 1 + k % 16 for k in range(1000)}


def test_a_removal_run_drops_predictions_of_the_removed_blocks() -> None:
    tokens = list(range(12))
    hashes = block_hashes(tokens, 4)
    index = PrefixIndex()
    index.apply("w", EventBatch(1.0, [BlockStored([1, 2, 3], None, tokens, 4)]))
    index.predict("w", hashes, ttl=10.0, now=0.0)  # the router routed the same prompt there again
    index.apply("w", EventBatch(1.0, [BlockRemoved([3]), BlockRemoved([2])]))
    assert index.overlaps(hashes, now=1.0, use_predicted=True) == {"w": 1}


def test_blocks_shared_by_two_adapters_stay_until_both_are_removed() -> None:
    tokens = list(range(8))
    hashes = block_hashes(tokens, 4)
    index = PrefixIndex()
    index.apply("w", EventBatch(1.0, [BlockStored([1, 2], None, tokens, 4), BlockStored([11, 12], None, tokens, 4)]))
    index.apply("w", EventBatch(1.0, [BlockRemoved([2]), BlockRemoved([1])]))
    assert index.overlaps(hashes) == {"w": 2} and index.block_count("w") == 2
    index.apply("w", EventBatch(1.0, [BlockRemoved([12]), BlockRemoved([12])]))
    assert index.overlaps(hashes) == {"w": 1} and index.counters.unknown_removed == 1


def test_a_shared_block_whose_device_copy_goes_is_left_in_the_lower_tier() -> None:
    """One prompt block under two engine hashes (two adapters), one copy on the device, one offloaded to
    host memory: once the device copy is removed, the block counts at the host tier's credit."""
    index = PrefixIndex(block_size=BLOCK)
    index.apply("a", EventBatch(1.0, _events([("store", 0, 0, 1, "GPU", 1), ("store", 0, 0, 1, "CPU", 0)])), now=5.0)
    assert index.lower_tier_blocks("a", ROUTER[0], 1) == {}, "on the device through one of its engine blocks"
    index.apply("a", EventBatch(1.0, _events([("remove", 0, 0, "GPU", 1)])), now=5.0)
    assert index.overlaps(ROUTER[0]) == {"a": 1}
    assert index.lower_tier_blocks("a", ROUTER[0], 1) == {"CPU": 1}


LONG = list(range(1000, 1000 + 700 * BLOCK))  # 700 blocks: the query walks several chunks
LONG_HASHES = block_hashes(LONG, BLOCK)


churn = st.lists(st.tuples(st.integers(0, 69), st.integers(0, 699), st.booleans(), st.integers(1, 700)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 700), st.lists(st.integers(0, 699), max_size=3)), min_size=1, max_size=70),
       st.integers(1, 700), churn)
def test_long_prompts_with_many_holders_match_brute_force(holds: list[tuple[int, list[int]]], length: int,
                                                          steps: list[tuple[int, int, bool, int]]) -> None:
    """Worker k holds the first ``depth`` blocks of a long prompt minus a few holes (evicted
    blocks); the query over the first ``length`` blocks must equal a plain per-worker scan. Then
    workers evict or re-store single blocks between queries of other lengths (the index's
    remembered runs are resumed, or forgotten when a mask they cover changes)."""
    with patch("infera.kv.index.RUN_MIN_BLOCKS", 4), patch("infera.kv.bitmasks._FEW", 4):  # both walks
        _long_prompts(holds, length, steps)


def _long_prompts(holds: list[tuple[int, list[int]]], length: int, steps: list[tuple[int, int, bool, int]]) -> None:
    index = PrefixIndex(block_size=BLOCK)
    held: dict[str, set[int]] = {}
    for k, (depth, holes) in enumerate(holds):
        w = f"w{k}"
        engine = [k * 10_000 + j for j in range(depth)]
        events: list[KvEvent] = [BlockStored(engine, None, LONG[: depth * BLOCK], BLOCK)] if depth else []
        events += [BlockRemoved([engine[j]]) for j in sorted(set(holes)) if j < depth]
        index.apply(w, EventBatch(1.0, events or [AllBlocksCleared()]))
        held[w] = {LONG_HASHES[j] for j in range(depth)} - {LONG_HASHES[j] for j in holes}
    _check_long(index, held, length)
    for k, j, evict, n in steps:
        w = f"w{k % len(holds)}"
        eh = (k % len(holds)) * 10_000 + j
        if evict:
            index.apply(w, EventBatch(1.0, [BlockRemoved([eh])]))
            held[w].discard(LONG_HASHES[j])
        elif LONG_HASHES[j] not in held[w] and (j == 0 or LONG_HASHES[j - 1] in held[w]):
            parent = None if j == 0 else eh - 1
            index.apply(w, EventBatch(1.0, [BlockStored([eh], parent, LONG[j * BLOCK : (j + 1) * BLOCK], BLOCK)]))
            held[w].add(LONG_HASHES[j])
        _check_long(index, held, length)
        _check_long(index, held, n)


def _check_long(index: PrefixIndex, held: dict[str, set[int]], length: int) -> None:
    hashes = LONG_HASHES[:length]
    want = {}
    for w, blocks in held.items():
        n = 0
        while n < len(hashes) and hashes[n] in blocks:
            n += 1
        if n:
            want[w] = n
    assert index.overlaps(hashes) == want
    assert index._shared == {h: m for h, m in index._holders.items() if m.bit_count() > 1}
