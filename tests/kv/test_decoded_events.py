"""The index fed with decoded batches (token ids left as msgpack bytes, ``TokenIds``) ends in the state the same
events built in code give, on the C path and on the pure-Python one."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv import hashing
from infera.kv.index import PrefixIndex
from infera.kv.native import load
from infera.protocols.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventDecodeError,
    TokenIds,
    decode_batch,
    encode_batch,
)
from tests.kv.test_native import BLOCK, ROUTER, WORKERS, _events, _state, op

PATHS = [False, pytest.param(True, marks=pytest.mark.skipif(load() is None, reason="the C extension is not built"))]


def _decoded(batch: EventBatch) -> EventBatch:
    out = decode_batch(encode_batch(batch))
    assert all(type(ev.token_ids) is TokenIds for ev in out.events if isinstance(ev, BlockStored))
    return out


@pytest.mark.parametrize("native", PATHS)
@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, max_size=30))
def test_decoded_batches_give_the_state_of_the_batches_built_in_code(native: bool, ops: list[tuple[Any, ...]]) -> None:
    wire, built = PrefixIndex(block_size=BLOCK, native=native), PrefixIndex(block_size=BLOCK, native=False)
    now = 100.0
    for o in ops:
        if o[0] == "events":
            batch = EventBatch(1.0, _events(o[2]))
            wire.apply(o[1], _decoded(batch), now=5.0)
            built.apply(o[1], batch, now=5.0)
        elif o[0] == "clear":
            for index in (wire, built):
                index.apply(o[1], EventBatch(1.0, [AllBlocksCleared()]), now=5.0)
        elif o[0] == "remove_worker":
            for index in (wire, built):
                index.remove_worker(o[1])
        elif o[0] == "predict":
            for index in (wire, built):
                index.predict(o[1], ROUTER[o[2]][: o[3]], ttl=o[4], now=now)
        else:
            now += o[1]
        assert _state(wire) == _state(built)
        for hashes in ROUTER:
            assert wire.overlaps(hashes, now=now) == built.overlaps(hashes, now=now)
        for w in WORKERS:
            assert wire.cache_view(w) == built.cache_view(w)


def _stored_payload(token_ids: Any, hashes: list[int], block_size: int = 4) -> bytes:
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": token_ids,
          "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None}
    return msgpack.packb([1.0, [ev], 0], use_bin_type=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize("native", PATHS)
def test_partial_tail_blocks_and_too_few_ids(native: bool) -> None:
    tokens = list(range(70_000, 70_010))  # two full blocks of 4 and a partial one
    index = PrefixIndex(block_size=4, native=native)
    index.apply("w", decode_batch(_stored_payload(tokens, [1, 2, 3])))
    assert index.counters.orphan_blocks == 1  # the third block has 2 ids of 4
    assert index.overlaps(hashing.pure_block_hashes(tokens, 4)) == {"w": 2}
    index.apply("w", decode_batch(_stored_payload([], [9])))
    assert index.counters.orphan_blocks == 2


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("bad", [[1, 2, 3, 2**32], [1, 2, 3, -1], [1, 2, 3, 1.5]])
def test_ids_outside_uint32_fail_as_they_do_in_a_list(native: bool, bad: list[Any]) -> None:
    decoded = decode_batch(_stored_payload(bad, [1]))
    assert type(decoded.events[0].token_ids) is TokenIds  # type: ignore[union-attr]
    for batch in (decoded, EventBatch(1.0, [BlockStored([1], None, bad, 4)])):
        index = PrefixIndex(block_size=4, native=native)
        with pytest.raises(struct.error):
            index.apply("w", batch)
        assert index.block_count("w") == 0


@pytest.mark.parametrize("native", PATHS)
def test_token_ids_that_are_not_msgpack_raise_a_decode_error(native: bool) -> None:
    index = PrefixIndex(block_size=4, native=native)
    batch = EventBatch(1.0, [BlockStored([1], None, TokenIds(b"\x94\x01\x02"), 4)])
    with pytest.raises(KvEventDecodeError, match="token_ids"):
        index.apply("w", batch)
    assert index.block_count("w") == 0
    index.apply("w", EventBatch(1.0, [BlockRemoved([1])]))
    assert index.counters.unknown_removed == 1
