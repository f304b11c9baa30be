"""The kvd socket message: one versioned JSON line per hint."""

from __future__ import annotations

import json

import pytest

from infera.kv.hashing import block_hashes
from infera.protocols.kvd import KVD_VERSION, KvdDecodeError, decode_hint, encode_hint, make_hint


def test_a_hint_is_one_json_line_that_round_trips() -> None:
    tokens = list(range(40))  # 2 full blocks of 16 and a partial one
    hashes = block_hashes(tokens, 16)
    hint = make_hint("w1", "m", 16, hashes, tokens, priority=3)
    line = encode_hint(hint)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    assert doc["v"] == KVD_VERSION and doc["kind"] == "prewarm" and doc["worker"] == "w1"
    assert [b["hash"] for b in doc["blocks"]] == [f"{h:016x}" for h in hashes]
    assert doc["blocks"][1]["token_ids"] == list(range(16, 32))
    back = decode_hint(line)
    assert back == hint
    assert back.token_ids() == tokens[:32]


def test_hashes_above_2_63_survive_as_hex() -> None:
    hint = make_hint("w", "m", 2, [2**64 - 1], [7, 8])
    assert b'"ffffffffffffffff"' in encode_hint(hint)
    assert decode_hint(encode_hint(hint)).blocks[0].hash == 2**64 - 1


@pytest.mark.parametrize(("doc", "why"), [
    ({"v": 2, "kind": "prewarm"}, "unsupported version"),
    ({"v": 1, "kind": "evict"}, "unknown kind"),
    ({"v": 1, "kind": "prewarm", "model": "m", "block_size": 2, "blocks": []}, "worker"),
    ({"v": 1, "kind": "prewarm", "worker": "w", "block_size": 2,
      "blocks": [{"hash": "00000000000000ff", "token_ids": [1]}]}, "token_ids must be 2"),
    ({"v": 1, "kind": "prewarm", "worker": "w", "block_size": 2,
      "blocks": [{"hash": 255, "token_ids": [1, 2]}]}, "16 hex digits"),
    ({"v": 1, "kind": "prewarm", "worker": "w", "block_size": 2, "priority": "high", "blocks": []}, "priority"),
])
def test_a_reader_refuses_what_it_does_not_understand(doc: dict[str, object], why: str) -> None:
    with pytest.raises(KvdDecodeError, match=why):
        decode_hint(json.dumps(doc))


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(KvdDecodeError):
        decode_hint(b"\xff not json\n")
    with pytest.raises(KvdDecodeError):
        decode_hint(b"[1, 2]\n")
