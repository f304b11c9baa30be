"""The KV-event decoder/encoder against the golden vLLM 0.32 trace and the other layouts."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.protocols.kv_events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    KvEventDecodeError,
    TokenIds,
    _decode_general,
    decode_batch,
    encode_batch,
    seq_from_bytes,
)


def _frames(path: Path) -> list[list[bytes]]:
    return [
        [base64.b64decode(f) for f in json.loads(line)["frames_b64"]]
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _event(raw: dict[str, Any]) -> KvEvent:
    fields = {k: v for k, v in raw.items() if k != "type"}
    if raw["type"] == "BlockStored":
        return BlockStored(**fields)
    if raw["type"] == "BlockRemoved":
        return BlockRemoved(**fields)
    assert raw["type"] == "AllBlocksCleared"
    return AllBlocksCleared()


@pytest.fixture(scope="module")
def live(golden_dir: Path) -> list[list[bytes]]:
    return _frames(golden_dir / "frames.jsonl")


@pytest.fixture(scope="module")
def decoded(golden_dir: Path) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((golden_dir / "decoded.json").read_text())
    return data


def test_every_live_frame_decodes_to_the_golden_batch(live: list[list[bytes]], decoded: list[dict[str, Any]]) -> None:
    assert len(live) == len(decoded) == 12
    for (topic, seq, payload), want in zip(live, decoded, strict=True):
        assert topic.decode() == want["topic"]
        assert seq_from_bytes(seq) == want["seq"]
        assert len(payload) == want["payload_len"]
        batch = decode_batch(payload)
        assert batch.ts == want["ts"]
        assert batch.data_parallel_rank == want["data_parallel_rank"]
        assert batch.events == [_event(e) for e in want["events"]]


def test_trace_totals_and_unsigned_hashes(live: list[list[bytes]]) -> None:
    events = [ev for _, _, payload in live for ev in decode_batch(payload).events]
    kinds = [type(ev).__name__ for ev in events]
    assert (kinds.count("BlockStored"), kinds.count("BlockRemoved"), kinds.count("AllBlocksCleared")) == (12, 4, 1)
    hashes = [h for ev in events if isinstance(ev, BlockStored | BlockRemoved) for h in ev.block_hashes]
    assert all(0 <= h < 2**64 for h in hashes)
    assert any(h >= 2**63 for h in hashes)  # read as unsigned, not wrapped negative


def test_reencode_is_byte_exact(live: list[list[bytes]]) -> None:
    for _, _, payload in live:
        assert encode_batch(decode_batch(payload)) == payload


def test_replay_payloads_equal_live_ones_and_end_marker(golden_dir: Path, live: list[list[bytes]]) -> None:
    replay = _frames(golden_dir / "replay.jsonl")
    by_seq = {seq_from_bytes(seq): payload for _, seq, payload in live}
    *messages, end = replay
    assert [seq_from_bytes(m[2]) for m in messages] == list(range(2, 12))
    for empty, topic, seq, payload in messages:
        assert empty == b""
        assert topic == b"kv-events"
        assert payload == by_seq[seq_from_bytes(seq)]
        assert decode_batch(payload) == decode_batch(by_seq[seq_from_bytes(seq)])
    assert end == [b"", b"", b"\xff" * 8, b""]
    assert seq_from_bytes(end[2]) == REPLAY_END_SEQ


def test_array_form_events_of_older_vllm() -> None:
    tokens = list(range(8))
    payload = msgpack.packb(
        [1.5, [
            ["BlockStored", [2**64 - 1, 7], None, tokens, 4, None, "GPU", None],
            ["BlockRemoved", [2**64 - 1], "CPU"],
            ["AllBlocksCleared"],
        ], 0],
        use_bin_type=True,
    )
    assert decode_batch(payload) == EventBatch(
        ts=1.5,
        events=[
            BlockStored(block_hashes=[2**64 - 1, 7], parent_block_hash=None, token_ids=tokens, block_size=4,
                        medium="GPU"),
            BlockRemoved(block_hashes=[2**64 - 1], medium="CPU"),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )


def test_sglang_style_trailing_fields_left_out() -> None:
    # SGLang stops after block_size, leaves medium out of BlockRemoved and may omit the dp rank.
    payload = msgpack.packb(
        [2.0, [["BlockStored", [11, 12], 10, [1, 2, 3, 4], 2], ["BlockRemoved", [11]]]], use_bin_type=True
    )
    batch = decode_batch(payload)
    assert batch.data_parallel_rank is None
    stored, removed = batch.events
    assert stored == BlockStored(block_hashes=[11, 12], parent_block_hash=10, token_ids=[1, 2, 3, 4], block_size=2,
                                 medium=None)
    assert removed == BlockRemoved(block_hashes=[11], medium=None)


def test_map_form_with_missing_optional_keys() -> None:
    payload = msgpack.packb(
        [3.0, [{"type": "BlockStored", "block_hashes": [5], "parent_block_hash": None, "token_ids": [9, 9],
                "block_size": 2}], 1],
        use_bin_type=True,
    )
    (stored,) = decode_batch(payload).events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [5] and stored.token_ids == [9, 9] and stored.medium is None


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # a byte msgpack never uses
        b"",
        msgpack.packb({"ts": 1.0}),
        msgpack.packb([1.0]),
        msgpack.packb([1.0, [42], 0]),
        msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": "nope"}], 0]),
    ],
)
def test_garbage_raises_decode_error(payload: bytes) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_batch(payload)


def test_the_fast_path_keeps_token_ids_as_msgpack_bytes_that_read_as_a_list(live: list[list[bytes]]) -> None:
    stored = [ev for _, _, payload in live for ev in decode_batch(payload).events if isinstance(ev, BlockStored)]
    for ev in stored:
        ids = ev.token_ids
        assert type(ids) is TokenIds
        plain = msgspec.msgpack.decode(ids.packed)
        assert msgspec.msgpack.encode(plain) == bytes(ids.packed)  # the wire bytes, as vLLM wrote them
        assert ids == plain and plain == ids and ids == TokenIds(bytes(ids.packed))
        assert ids != [*plain, 1] and ids != tuple(plain) and ids != "x"
        assert len(ids) == len(plain) and list(ids) == plain and ids[0] == plain[0] and ids[1:3] == plain[1:3]
        assert repr(ids) == f"TokenIds({plain!r})"
    with pytest.raises(TypeError):
        hash(stored[0].token_ids)  # like the list it stands for


_INT = st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1), st.integers(2**32, 2**64 - 1))
_stored = st.fixed_dictionaries(
    {"type": st.just("BlockStored"), "block_hashes": st.lists(_INT, max_size=4),
     "parent_block_hash": st.one_of(st.none(), _INT),
     "token_ids": st.one_of(st.lists(_INT, max_size=12), st.none(), st.lists(st.one_of(st.integers(-5, 5),
                                                                                            st.floats(0, 1)),
                                                                                  max_size=3)),
     "block_size": st.integers(-1, 4)},
    optional={"lora_id": st.one_of(st.none(), st.integers(0, 3)), "medium": st.sampled_from([None, "GPU", "CPU"]),
              "lora_name": st.one_of(st.none(), st.just("a")), "extra_keys": st.one_of(st.none(), st.just([1])),
              "group_idx": st.one_of(st.none(), st.integers(0, 2)), "kv_cache_spec_kind": st.just("full")})
_removed = st.fixed_dictionaries({"type": st.just("BlockRemoved"), "block_hashes": st.lists(_INT, max_size=3)},
                                 optional={"medium": st.sampled_from([None, "GPU", "CPU"]),
                                           "group_idx": st.integers(0, 2)})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_stored, _removed, st.just({"type": "AllBlocksCleared"})), max_size=6),
       st.sampled_from([None, 0, 1]))
def test_the_fast_path_reads_what_the_general_decoder_reads(events: list[dict[str, Any]], dp: int | None) -> None:
    payload = msgpack.packb([1.25, events] + ([] if dp is None else [dp]), use_bin_type=True)
    assert decode_batch(payload) == _decode_general(payload)


def test_token_ids_that_are_not_an_array_take_the_general_path() -> None:
    ev = {"type": "BlockStored", "block_hashes": [5], "parent_block_hash": None, "token_ids": None, "block_size": 2,
          "lora_id": None, "medium": "GPU", "lora_name": None}
    (stored,) = decode_batch(msgpack.packb([1.0, [ev], 0])).events
    assert isinstance(stored, BlockStored) and stored.token_ids == [] and type(stored.token_ids) is list


@pytest.mark.parametrize("packed", [b"", b"\xc1", b"\x92\x01", b"\x92\x01\x02\x03", b"\xa1x", b"\xc0"])
def test_token_ids_that_are_not_one_msgpack_array_raise_on_use(packed: bytes) -> None:
    ids = TokenIds(packed)
    with pytest.raises(KvEventDecodeError, match="token_ids"):
        len(ids)
    with pytest.raises(KvEventDecodeError, match="token_ids"):
        encode_batch(EventBatch(1.0, [BlockStored([1], None, ids, 1)]))


def test_replay_step_rules() -> None:
    from infera.protocols.kv_events import REPLAY_END_SEQ, replay_step

    assert replay_step(REPLAY_END_SEQ, 5, 2, None) == "done"
    assert replay_step(1, 2, 2, None) == "skip"  # applied already
    assert replay_step(9, 5, 5, 9) == "skip"  # past the gap being filled
    assert replay_step(5, 5, 5, 9) == "deliver"
    assert replay_step(7, 6, 5, 9) == "done"  # a hole in the engine's buffer after progress
    assert replay_step(7, 5, 5, 9) == "unreachable"  # the buffer starts after what we need
    assert replay_step(7, 0, 0, None) == "deliver"  # a fresh subscriber takes what the buffer holds


def test_a_decoded_events_token_ids_are_those_the_constructor_gives() -> None:
    """The fast path builds TokenIds without calling __init__: every slot is set as TokenIds(raw) sets it."""
    ev = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [5, 6, 7, 8],
          "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None}
    stored = decode_batch(msgpack.packb([1.0, [ev], 0], use_bin_type=True)).events[0]
    assert isinstance(stored, BlockStored) and type(stored.token_ids) is TokenIds
    built = TokenIds(stored.token_ids.packed)
    assert {s: getattr(stored.token_ids, s) for s in TokenIds.__slots__} == \
        {s: getattr(built, s) for s in TokenIds.__slots__}
    assert bytes(stored.token_ids.packed) == msgpack.packb([5, 6, 7, 8])
    assert stored.token_ids == [5, 6, 7, 8] and len(stored.token_ids) == 4
