"""The router's own block hashes, computed from token ids.

A prompt is cut into blocks of ``block_size`` tokens; only full blocks are hashed (an
engine never caches a partial block). Each block's hash covers its tokens and its
parent's hash, so equal hashes mean equal prefixes up to and including that block:

    hash_i = xxh3_64(tokens of block i as little-endian uint32, seed=hash_{i-1}),  hash_{-1} = parent

Hashes are unsigned 64-bit ints. They never come from the engine: engines use other
recipes (vLLM: sha256 over pickled tuples) and publish only 64 bits of them, so the
router rebuilds its own from the token ids carried by ``BlockStored`` events.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import overload

import xxhash

from infera.kv.native import load

_xxh3 = xxhash.xxh3_64_intdigest
_native = load()  # the C loop (same hashes), or None: see infera.kv.native


class PromptIds(list[int]):
    """Token ids that know the block hashes of a leading part already hashed (see kv.prompt_cache).

    ``origin``: the ids as the cache holds them (a uint32 ``array``); both fields below are
    trusted only while these ids still equal it (a caller that edits the list in place gets a
    plain hashing).
    ``known_hashes``: block size -> hashes of leading full blocks of ``origin`` (chain from 0).
    ``sink``: where ``block_hashes`` stores the full result for later prompts.
    ``ints``: the int objects the cache filled the list with (``ints[i]`` is the int ``i``): an item
    that is still that object equals its origin's id without being read.
    ``complete``: block size -> hashes of every full block of ``origin``, made by the cache from it
    for the block sizes it has seen: the hashes of this list as it was handed out, for a caller
    that takes them before anything could change it (the router's context); ``block_hashes``
    does not read them.
    """

    __slots__ = ("complete", "ints", "known_hashes", "origin", "sink")

    def __init__(self, ids: Sequence[int] = ()) -> None:
        super().__init__(ids)
        self.origin: array[int] | None = None
        self.known_hashes: dict[int, list[int]] | None = None
        self.sink: dict[int, list[int]] | None = None
        self.ints: tuple[int, ...] = ()
        self.complete: dict[int, list[int]] | None = None


class ArrayIds(Sequence[int]):
    """Token ids read from a uint32 ``array`` the prompt cache keeps (read only: nobody writes it again).

    What the router's context gets instead of a list (``PromptCache.encode_within(listed=False)``):
    it only counts the ids and hashes their blocks, and the array is hashed in place (C), so no
    list of int objects is built per request. Compares equal to any sequence of the same ints.
    ``complete``: block size -> hashes of every full block (made with the ids); ``sink``: where
    :func:`block_hashes` stores another size's for later prompts (the cache entry's).
    """

    __slots__ = ("_ids", "complete", "sink")

    def __init__(self, ids: array[int], complete: dict[int, list[int]] | None = None,
                 sink: dict[int, list[int]] | None = None) -> None:
        self._ids = ids
        self.complete = complete
        self.sink = sink

    @property
    def array(self) -> array[int]:
        """The ids (do not modify: the prompt cache's own)."""
        return self._ids

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return self._ids[i].tolist()
        return self._ids[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def tolist(self) -> list[int]:
        return self._ids.tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArrayIds):
            return self._ids == other._ids
        if isinstance(other, array):
            return self._ids.tolist() == other.tolist()
        if isinstance(other, list | tuple):
            return len(other) == len(self._ids) and self._ids.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are not hashable

    def __repr__(self) -> str:
        return f"ArrayIds({self._ids.tolist()!r})"


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids``; a partial tail block is ignored.

    ``parent`` is the hash of the block before the first one (0 = the chain starts at
    token 0). Token ids must fit in uint32 (struct.error otherwise). Returns one hash
    per full block, in order; an empty list when there is no full block.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_blocks = len(token_ids) // block_size
    if n_blocks == 0:
        return []
    if type(token_ids) is ArrayIds:
        known = token_ids.complete.get(block_size) if token_ids.complete and parent == 0 else None
        if known is not None:
            return list(known)
        out = _chain_u32(token_ids.array, 0, n_blocks, block_size, parent)
        if token_ids.sink is not None and parent == 0:
            token_ids.sink[block_size] = list(out)  # the caller may keep and change ``out``
        return out
    if parent == 0 and type(token_ids) is PromptIds and token_ids.origin is not None and _same(token_ids):
        known = token_ids.known_hashes.get(block_size, []) if token_ids.known_hashes else []
        k = min(len(known), n_blocks)
        # the new blocks hashed from ``origin``, the equal uint32 array, in place
        out = known[:k] + _chain_u32(token_ids.origin, k, n_blocks, block_size, known[k - 1] if k else 0)
        if token_ids.sink is not None:
            token_ids.sink[block_size] = list(out)  # the caller may keep and change ``out``
        return out
    return _chain(token_ids, 0, n_blocks, block_size, parent)


def pure_block_hashes(token_ids: Sequence[int], block_size: int, parent: int = 0) -> list[int]:
    """:func:`block_hashes` in Python alone (no C, no PromptIds shortcut): the index's pure path."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return _chain_py(token_ids, 0, len(token_ids) // block_size, block_size, parent)


def extend_hashes(ids: array[int], known: list[int], block_size: int, most: int | None = None) -> list[int]:
    """Hashes of every full block of ``ids`` (uint32), given ``known``: hashes of its leading full blocks (any
    number; extra ones past the full blocks, or past the first ``most``, are dropped)."""
    if _native is not None and type(known) is list:  # the same in one C call: no slice, no concatenation
        out: list[int] = _native.extend_u32(ids, known, block_size, len(known) if most is None else most)
        return out
    n_blocks = len(ids) // block_size
    k = min(len(known), n_blocks if most is None or most > n_blocks else most)
    return known[:k] + _chain_u32(ids, k, n_blocks, block_size, known[k - 1] if k else 0)


def _same(ids: PromptIds) -> bool:
    """``ids`` still holds what its ``origin`` holds (a caller may have edited it): C, or the same in Python."""
    origin = ids.origin
    assert origin is not None
    if _native is not None:
        same: bool | None = _native.u32_equal(ids, origin, ids.ints)
        if same is not None:  # None: an item that is not an int
            return same
    return len(ids) == len(origin) and list(ids) == origin.tolist()


def _chain_u32(ids: array[int], first: int, n_blocks: int, block_size: int, parent: int) -> list[int]:
    """:func:`_chain` of a uint32 array."""
    if first >= n_blocks:
        return []
    if _native is not None:
        out: list[int] = _native.chain_hashes_u32(ids, first, n_blocks, block_size, parent)
        return out
    return _chain_py(ids.tolist(), first, n_blocks, block_size, parent)


def _chain(token_ids: Sequence[int], first: int, n_blocks: int, block_size: int, parent: int) -> list[int]:
    """Hashes of blocks ``first..n_blocks-1``, chained from ``parent``."""
    if first >= n_blocks:
        return []
    if _native is not None:
        out: list[int] | None = _native.chain_hashes(token_ids, first, n_blocks, block_size, parent)
        if out is not None:  # None: a token id outside uint32, which the Python path reports
            return out
    return _chain_py(token_ids, first, n_blocks, block_size, parent)


def _chain_py(token_ids: Sequence[int], first: int, n_blocks: int, block_size: int, parent: int) -> list[int]:
    if first >= n_blocks:
        return []
    n_tokens = (n_blocks - first) * block_size
    lo = first * block_size
    # struct.pack is the fastest list -> uint32 bytes path in CPython (about 9 ns a token,
    # array('I') about 13); the format string is cached by the struct module.
    body = token_ids if lo == 0 and n_tokens == len(token_ids) else token_ids[lo : lo + n_tokens]
    view = memoryview(struct.pack(f"<{n_tokens}I", *body))
    step = block_size * 4
    out: list[int] = []
    h = parent
    for start in range(0, n_tokens * 4, step):
        h = _xxh3(view[start : start + step], seed=h)
        out.append(h)
    return out
