"""Block hashes from the token ids' msgpack bytes (``chain_hashes_packed``) against the Python path: every msgpack
int width, empty and odd inputs, and bytes that are not an array of uint32 ints (None, never a crash)."""

from __future__ import annotations

import struct

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv import hashing
from infera.kv.native import load

native = load()
pytestmark = pytest.mark.skipif(native is None, reason="the C extension infera.kv._native is not built")

# Every msgpack form an int in [0, 2**32) can take: positive fixint, uint8/16/32/64 and int8/16/32/64.
_FORMS = {
    "fixint": (lambda v: v <= 0x7F, lambda v: bytes([v])),
    "uint8": (lambda v: v <= 0xFF, lambda v: b"\xcc" + struct.pack(">B", v)),
    "uint16": (lambda v: v <= 0xFFFF, lambda v: b"\xcd" + struct.pack(">H", v)),
    "uint32": (lambda v: True, lambda v: b"\xce" + struct.pack(">I", v)),
    "uint64": (lambda v: True, lambda v: b"\xcf" + struct.pack(">Q", v)),
    "int8": (lambda v: v <= 0x7F, lambda v: b"\xd0" + struct.pack(">b", v)),
    "int16": (lambda v: v <= 0x7FFF, lambda v: b"\xd1" + struct.pack(">h", v)),
    "int32": (lambda v: v <= 0x7FFFFFFF, lambda v: b"\xd2" + struct.pack(">i", v)),
    "int64": (lambda v: True, lambda v: b"\xd3" + struct.pack(">q", v)),
}


def _header(n: int, form: str) -> bytes:
    """An array header for ``n`` elements: the smallest form, or a wider one as another encoder may write."""
    if form == "fix" and n <= 15:
        return bytes([0x90 | n])
    if form != "32" and n <= 0xFFFF:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def _pack(tokens: list[int], forms: list[str], header: str) -> bytes:
    out = [_header(len(tokens), header)]
    for i, v in enumerate(tokens):
        fits = [f for f in (forms[i % len(forms)], "uint32") if _FORMS[f][0](v)]
        out.append(_FORMS[fits[0]][1](v))
    return b"".join(out)


def _want(tokens: list[int], n_blocks: int, block_size: int, parent: int) -> list[int]:
    n = max(0, min(n_blocks, len(tokens) // block_size))
    return hashing._chain_py(tokens[: n * block_size], 0, n, block_size, parent)


token = st.one_of(st.integers(0, 0x7F), st.integers(0x80, 0xFF), st.integers(0x100, 0xFFFF),
                  st.integers(0x10000, 2**32 - 1),
                  st.sampled_from([0, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 2**31, 2**32 - 1]))


@settings(max_examples=500, deadline=None)
@given(st.lists(token, max_size=80), st.integers(1, 20), st.integers(-1, 30), st.integers(0, 2**64 - 1),
       st.lists(st.sampled_from(sorted(_FORMS)), min_size=1, max_size=4), st.sampled_from(["fix", "16", "32"]))
def test_hashes_from_msgpack_equal_the_python_path(tokens: list[int], block_size: int, n_blocks: int, parent: int,
                                                   forms: list[str], header: str) -> None:
    assert native is not None
    want = _want(tokens, n_blocks, block_size, parent)
    packed = _pack(tokens, forms, header)
    assert msgspec.msgpack.decode(packed) == tokens  # the encoding is valid msgpack for these ids
    assert native.chain_hashes_packed(packed, n_blocks, block_size, parent) == want
    assert native.chain_hashes_packed(memoryview(packed), n_blocks, block_size, parent) == want
    minimal = msgspec.msgpack.encode(tokens)  # what vLLM sends
    assert native.chain_hashes_packed(minimal, n_blocks, block_size, parent) == want
    if n_blocks >= 0:
        assert native.chain_hashes(tokens, 0, n_blocks, block_size, parent) == want


def test_a_block_size_above_the_stack_buffer() -> None:
    assert native is not None
    tokens = list(range(70_000, 71_000))
    assert native.chain_hashes_packed(msgpack.packb(tokens), 2, 500, 9) == _want(tokens, 2, 500, 9)
    assert native.chain_hashes_packed(msgpack.packb([]), 3, 4, 0) == []


@pytest.mark.parametrize("bad", [
    [1, 2, 3, 2**32],  # too wide for uint32
    [1, 2, 3, -1],  # negative fixint
    [1, 2, 3, -200],  # int16 holding a negative value
    [1, 2, 3, 1.5],
    [1, 2, 3, None],
    [1, 2, 3, "4"],
    [1, 2, 3, b"4"],
    [1, 2, 3, [4]],
    [1, 2, 3, 4, 5, -1],  # past the last full block: checked all the same, the Python path then decides
])
def test_ids_outside_uint32_or_not_ints_give_none(bad: list[object]) -> None:
    assert native is not None
    assert native.chain_hashes_packed(msgpack.packb(bad, use_bin_type=True), 1, 4, 0) is None


@pytest.mark.parametrize("raw", [
    b"",
    b"\xc0",  # nil
    b"\x81\x01\x02",  # a map
    b"\xa3abc",  # a string
    b"\x05",  # an int
    b"\x94\x01\x02\x03",  # 4 elements announced, 3 there
    b"\x92\x01\xcd\x01",  # an element cut short
    b"\xdc\x00",  # a header cut short
    b"\xdd\x00\x00",
    b"\xdd\xff\xff\xff\xff\x01",  # an absurd count
    b"\x92\x01\x02\x03",  # a byte after the array
    b"\x92\x01\x02\x92\x01\x02",  # two arrays
])
def test_malformed_bytes_give_none(raw: bytes) -> None:
    assert native is not None
    for n_blocks in (0, 1, 2):
        assert native.chain_hashes_packed(raw, n_blocks, 2, 0) is None


def test_arguments_are_checked() -> None:
    assert native is not None
    with pytest.raises(TypeError):
        native.chain_hashes_packed([1, 2], 1, 2, 0)  # type: ignore[arg-type]  # not bytes-like
    with pytest.raises(ValueError, match="block_size"):
        native.chain_hashes_packed(b"\x92\x01\x02", 1, 0, 0)
    with pytest.raises(OverflowError):
        native.chain_hashes_packed(b"\x92\x01\x02", 1, 2, -1)
    with pytest.raises(TypeError):
        native.chain_hashes_packed(b"\x92\x01\x02", 1, 2)  # type: ignore[call-arg]


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 8), st.integers(1, 4))
def test_any_bytes_hash_as_their_decoding_or_give_none(raw: bytes, n_blocks: int, block_size: int) -> None:
    assert native is not None
    got = native.chain_hashes_packed(raw, n_blocks, block_size, 0)
    try:
        ids = msgspec.msgpack.decode(raw)
    except msgspec.DecodeError:
        assert got is None
        return
    ok = isinstance(ids, list) and all(type(t) is int and 0 <= t < 2**32 for t in ids)
    assert got == (_want(ids, n_blocks, block_size, 0) if ok else None)


def _tables() -> list[object]:
    """A worker's and an index's tables as PrefixIndex's C path holds them; the worker (bit 1) holds engine block 7
    (router hash 1234)."""
    assert native is not None
    blocks, holders = native.U64Map(False), native.U64Map(True)
    blocks[7], holders[1234] = 1234, 1
    return [blocks, {}, {}, {}, {}, holders, {}, set(), {}, 1]


def _contents(tables: list[object]) -> list[object]:
    return [sorted(t.items()) if hasattr(t, "items") else t for t in tables]  # type: ignore[attr-defined]


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=48), st.lists(st.integers(0, 2**32 - 1), max_size=24).map(msgpack.packb)),
       st.lists(st.one_of(st.integers(0, 2**64 - 1), st.just(7)), max_size=6, unique=True), st.integers(1, 4),
       st.sampled_from([None, 7, 8, -1]))
def test_store_packed_is_the_parent_lookup_the_hashing_and_the_store_loop(raw: bytes, hashes: list[int],
                                                                          block_size: int, parent: int | None) -> None:
    """One call does what _store's three steps do, and changes nothing when it gives None or an unknown parent."""
    assert native is not None
    one, two = _tables(), _tables()
    got = native.store_packed(*one, hashes, parent, raw, block_size)  # type: ignore[arg-type]
    found = 0 if parent is None else two[0].get(parent)  # type: ignore[attr-defined]
    if found is None:
        assert got == (None, 0, False)
    else:
        locals_ = native.chain_hashes_packed(raw, len(hashes), block_size, found)
        if locals_ is None:
            assert got is None
        else:
            done, forget = native.store_blocks(*two, hashes, locals_, 0)  # type: ignore[arg-type]
            assert got == (locals_, done, forget)
    assert _contents(one) == _contents(two)


def test_store_packed_checks_its_arguments() -> None:
    assert native is not None
    with pytest.raises(ValueError, match="block_size"):
        native.store_packed(*_tables(), [1], None, b"\x92\x01\x02", 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.store_packed(*_tables(), [1], None, b"\x92\x01\x02")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        native.store_packed(*_tables(), [1], None, [1, 2], 2)  # type: ignore[arg-type]  # not bytes-like
