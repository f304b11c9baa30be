"""PrefixIndex against the golden vLLM trace, a simple model (hypothesis), and predictions."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.hashing import block_hashes
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, decode_batch

pytestmark = pytest.mark.usefixtures("index_path")  # pure Python and C (tests/kv/conftest.py)

BS = 128
W = "vllm-0"


@pytest.fixture(scope="module")
def trace(golden_dir: Path) -> tuple[list[dict[str, Any]], dict[int, EventBatch]]:
    requests = [json.loads(line) for line in (golden_dir / "requests.jsonl").read_text().splitlines() if line]
    batches: dict[int, EventBatch] = {}
    for line in (golden_dir / "frames.jsonl").read_text().splitlines():
        _, seq, payload = (base64.b64decode(f) for f in json.loads(line)["frames_b64"])
        batches[int.from_bytes(seq, "big")] = decode_batch(payload)
    return requests, batches


def _labels(requests: list[dict[str, Any]]) -> dict[str, int]:
    """README labels -> router hashes: A1..A4, B1..B4, D1.1..D8.4."""
    out: dict[str, int] = {}
    for r in requests:
        if r["kind"] != "completion" or r["label"] not in {"A", "B"} | {f"D{i}" for i in range(1, 9)}:
            continue
        for i, h in enumerate(block_hashes(r["prompt_token_ids"], BS), start=1):
            out[f"{r['label']}{'.' if r['label'].startswith('D') else ''}{i}"] = h
    return out


def _held(index: PrefixIndex, labels: dict[str, int]) -> set[str]:
    return {name for name, h in labels.items() if W in index.overlaps([h])}


def _expected(step: str) -> set[str]:
    a = {f"A{i}" for i in range(1, 5)}
    b = {f"B{i}" for i in range(1, 5)}

    def d(n: int) -> set[str]:
        return {f"D{k}.{i}" for k in range(1, n + 1) for i in range(1, 5)}

    if step in {"a", "b"}:
        return a
    if step == "c":
        return a | b
    if step.startswith("d") and step != "d8":
        return a | b | d(int(step[1:]))
    if step == "d8":
        return {"A1", "A2"} | b | d(8)
    if step in {"e", "f"}:
        return a | {"B1", "B2"} | d(8)
    assert step == "g"
    return a


def test_golden_trace_index_contents_after_each_step(
    trace: tuple[list[dict[str, Any]], dict[int, EventBatch]],
) -> None:
    requests, batches = trace
    labels = _labels(requests)
    assert len(labels) == 4 + 4 + 8 * 4
    index = PrefixIndex(block_size=BS)
    for r in requests:
        for seq in r["batch_seqs"]:
            index.apply(W, batches[seq])
        want = _expected(r["step"])
        assert _held(index, labels) == want, r["step"]
        assert index.block_count(W) == len(want), r["step"]
        assert index.cache_view(W)["blocks_by_medium"] == {"GPU": len(want)}
    assert index.counters.as_dict() == {
        "block_stored": 12, "block_removed": 4, "all_blocks_cleared": 1,
        "orphan_blocks": 0, "unknown_removed": 0, "block_size_mismatch": 0,
    }
    view = index.cache_view(W)
    assert view["orphan_blocks"] == 0 and view["predicted_blocks"] == 0
    assert view["engine_hashes"] == batches[11].events[1].block_hashes  # type: ignore[union-attr]
    json.dumps(view)


def test_golden_prefix_match_predicts_cached_tokens(
    trace: tuple[list[dict[str, Any]], dict[int, EventBatch]],
) -> None:
    """Before each request, the index's overlap x block size is vLLM's cached_tokens (capped as vLLM caps)."""
    requests, batches = trace
    index = PrefixIndex(block_size=BS)
    seen = {}
    for r in requests:
        if r["kind"] == "completion":
            ids = r["prompt_token_ids"]
            blocks = index.overlaps(block_hashes(ids, BS)).get(W, 0)
            predicted = min(blocks, (len(ids) - 1) // BS) * BS
            seen[r["step"]] = blocks
            if r["step"] == "g":
                # The reset (f) is invisible until AllBlocksCleared arrives with g's own batch.
                assert (predicted, r["cached_tokens"]) == (512, 0)
            else:
                assert predicted == r["cached_tokens"], r["step"]
        for seq in r["batch_seqs"]:
            index.apply(W, batches[seq])
    assert seen["b"] == 4 and seen["e"] == 2


def _stored(hashes: list[int], parent: int | None, tokens: list[int], bs: int = 4, medium: str = "GPU") -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=bs, medium=medium)


def _batch(*events: Any) -> EventBatch:
    return EventBatch(ts=1.0, events=list(events))


def test_orphan_blocks_are_counted_not_inserted() -> None:
    index = PrefixIndex()
    index.apply("w", _batch(_stored([101, 102], 999, list(range(8)))))
    assert index.block_count("w") == 0
    assert index.counters.orphan_blocks == 2
    assert index.cache_view("w")["orphan_blocks"] == 2
    assert index.overlaps(block_hashes(list(range(8)), 4)) == {}


def test_child_chains_from_the_parents_local_hash() -> None:
    tokens = list(range(12))
    index = PrefixIndex()
    index.apply("w", _batch(_stored([1], None, tokens[:4]), _stored([2, 3], 1, tokens[4:12])))
    assert index.overlaps(block_hashes(tokens, 4)) == {"w": 3}
    assert index.overlaps(block_hashes(tokens[4:], 4)) == {}  # same tokens, different prefix


def test_too_few_token_ids_and_block_size_mismatch() -> None:
    index = PrefixIndex(block_size=4)
    index.apply("w", _batch(_stored([1, 2], None, list(range(6)))))
    assert index.block_count("w") == 1 and index.counters.orphan_blocks == 1
    index.apply("w", _batch(_stored([7], None, list(range(16)), bs=16)))
    assert index.block_count("w") == 1 and index.counters.block_size_mismatch == 1


def test_media_tiers_and_removal() -> None:
    tokens = list(range(4))
    index = PrefixIndex()
    index.apply("w", _batch(_stored([1], None, tokens), _stored([1], None, tokens, medium="CPU")))
    assert index.cache_view("w")["blocks_by_medium"] == {"GPU": 1, "CPU": 1}
    index.apply("w", _batch(BlockRemoved(block_hashes=[1], medium="GPU")))
    assert index.overlaps(block_hashes(tokens, 4)) == {"w": 1}  # still in host memory
    index.apply("w", _batch(BlockRemoved(block_hashes=[1], medium="CPU"), BlockRemoved(block_hashes=[1])))
    assert index.block_count("w") == 0 and index.counters.unknown_removed == 1
    assert index.overlaps(block_hashes(tokens, 4)) == {}


def test_overlaps_counts_contiguous_leading_blocks_per_worker() -> None:
    tokens = list(range(16))
    hashes = block_hashes(tokens, 4)
    engine = [10, 11, 12, 13]
    index = PrefixIndex()
    index.apply("full", _batch(_stored(engine, None, tokens)))
    index.apply("two", _batch(_stored(engine[:2], None, tokens[:8])))
    index.apply("gap", _batch(_stored(engine, None, tokens), BlockRemoved(block_hashes=[11])))
    index.apply("tail", _batch(_stored(engine, None, tokens), BlockRemoved(block_hashes=[10])))
    assert index.overlaps(hashes) == {"full": 4, "two": 2, "gap": 1}
    assert index.overlaps([]) == {}
    index.remove_worker("full")
    assert index.overlaps(hashes) == {"two": 2, "gap": 1}
    assert index.workers() == ["gap", "tail", "two"]
    index.apply("two", _batch(AllBlocksCleared()))
    assert index.overlaps(hashes) == {"gap": 1}


def test_predictions_count_only_when_asked_and_expire() -> None:
    hashes = block_hashes(list(range(16)), 4)
    index = PrefixIndex()
    index.apply("w1", _batch(_stored([1], None, list(range(4)))))
    index.predict("w1", hashes, ttl=2.0, now=100.0)
    index.predict("w2", hashes[:3], ttl=2.0, now=100.0)
    assert index.overlaps(hashes, now=100.5) == {"w1": 1}  # confirmed only by default
    assert index.overlaps(hashes, now=100.5, use_predicted=True) == {"w1": 4, "w2": 3}
    assert index.overlaps(hashes, now=100.5, use_predicted={"w2"}) == {"w1": 1, "w2": 3}
    assert index.cache_view("w2")["predicted_blocks"] == 3
    assert index.block_count("w2") == 0  # predictions never become confirmed blocks
    index.predict("w2", hashes[:1], ttl=5.0, now=101.0)  # extends the first block only
    assert index.overlaps(hashes, now=102.0, use_predicted=True) == {"w1": 1, "w2": 1}
    assert index.cache_view("w1")["predicted_blocks"] == 0  # pruned; w1's first block was confirmed anyway
    assert index.overlaps(hashes, now=106.0, use_predicted=True) == {"w1": 1}
    assert index.cache_view("w2")["predicted_blocks"] == 0
    assert not index._predicted and not index._expiry_heap


def test_events_override_predictions() -> None:
    tokens = list(range(8))
    hashes = block_hashes(tokens, 4)
    index = PrefixIndex()
    index.predict("w", hashes, ttl=60.0, now=0.0)
    index.apply("w", _batch(_stored([1, 2], None, tokens)))
    assert index.cache_view("w")["predicted_blocks"] == 0  # confirmed now
    index.apply("w", _batch(BlockRemoved(block_hashes=[2])))
    assert index.overlaps(hashes, now=1.0, use_predicted=True) == {"w": 1}
    index.predict("w", hashes, ttl=60.0, now=1.0)
    index.apply("w", _batch(AllBlocksCleared()))
    assert index.overlaps(hashes, now=2.0, use_predicted=True) == {}


# -- property test: random store/remove/clear against a simple model ----------------------

PROMPTS = [[p * 100 + t for t in range(16)] for p in range(3)] + [[0 * 100 + t for t in range(8)] + [999] * 8]
BLOCK = 4


def _engine_hash(tokens: list[int]) -> int:
    # content-addressed like vLLM's: the hash of the whole prefix
    return hash(tuple(tokens)) & (2**64 - 1)


op = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(["a", "b"]), st.integers(0, 3), st.integers(0, 3),
              st.integers(1, 4), st.sampled_from(["GPU", "CPU"])),
    st.tuples(st.just("remove"), st.sampled_from(["a", "b"]), st.integers(0, 3), st.integers(0, 3),
              st.sampled_from(["GPU", "CPU"])),
    st.tuples(st.just("clear"), st.sampled_from(["a", "b"])),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(op, max_size=40))
def test_random_events_match_a_simple_model(ops: list[tuple[Any, ...]]) -> None:
    index = PrefixIndex(block_size=BLOCK)
    model: dict[str, dict[int, set[str]]] = {"a": {}, "b": {}}  # worker -> engine hash -> media
    for o in ops:
        worker = o[1]
        held = model[worker]
        if o[0] == "store":
            _, _, p, start, n, medium = o
            tokens = PROMPTS[p]
            end = min(4, start + n)
            engine = [_engine_hash(tokens[: (j + 1) * BLOCK]) for j in range(start, end)]
            parent = None if start == 0 else _engine_hash(tokens[: start * BLOCK])
            index.apply(worker, _batch(_stored(engine, parent, tokens[start * BLOCK : end * BLOCK], BLOCK, medium)))
            if parent is None or parent in held:
                for h in engine:
                    held.setdefault(h, set()).add(medium)
        elif o[0] == "remove":
            _, _, p, j, medium = o
            h = _engine_hash(PROMPTS[p][: (j + 1) * BLOCK])
            index.apply(worker, _batch(BlockRemoved(block_hashes=[h], medium=medium)))
            if h in held:
                held[h].discard(medium) if medium in held[h] else held[h].clear()
                if not held[h]:
                    del held[h]
        else:
            index.apply(worker, _batch(AllBlocksCleared()))
            held.clear()
        for w in ("a", "b"):
            assert index.block_count(w) == len(model[w])
        for tokens in PROMPTS:
            want = {}
            for w in ("a", "b"):
                n = 0
                while n < 4 and _engine_hash(tokens[: (n + 1) * BLOCK]) in model[w]:
                    n += 1
                if n:
                    want[w] = n
            assert index.overlaps(block_hashes(tokens, BLOCK)) == want


def test_two_engine_blocks_with_the_same_tokens_are_refcounted() -> None:
    # e.g. the same prompt under two LoRA adapters: two engine hashes, one router hash
    tokens = list(range(4))
    index = PrefixIndex()
    index.apply("w", _batch(_stored([1], None, tokens), _stored([2], None, tokens)))
    assert index.block_count("w") == 2
    index.apply("w", _batch(BlockRemoved(block_hashes=[1])))
    assert index.overlaps(block_hashes(tokens, 4)) == {"w": 1}
    index.apply("w", _batch(BlockRemoved(block_hashes=[2])))
    assert index.overlaps(block_hashes(tokens, 4)) == {}
