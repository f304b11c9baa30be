"""Token ids of rendered prompts, reused for the same leading text: prompt work ~ what is new.

A chat prompt is mostly text the router tokenized a moment ago: a shared system prompt,
the same tool list, a session's earlier turns. ``PromptCache.encode(text)`` finds the
longest prefix of ``text`` that an earlier prompt also started with, ending right after
a *boundary token* (an added token such as ``<|im_start|>``), takes that prefix's ids
from the earlier prompt and encodes only the rest.

Why that is exact: the codec splits text on its boundary tokens before anything else and
encodes each section on its own (tiktoken, ``tokenizers`` with plain added tokens, the
byte codec; ``Codec.boundaries`` is empty for any codec without that guarantee, and the
cache is then bypassed). So ``ids(a + b) == ids(a) + ids(b)`` when ``a`` ends with a
boundary token, provided the character after it cannot change ``a`` under the codec's
normaliser: a cut is used only where the next character is ASCII or the text ends there
(NFC composes ``>`` with U+0338). No boundary token may contain another (checked by the
codecs), so a cut never falls inside a longer added token. A reuse is confirmed by
comparing the prefix bytes, so a hash collision costs a miss, never a wrong id.

Lookup: the utf-8 bytes of every cut point are keyed by xxh3-64 of the text before it.
Every stored prompt registers all its cuts, so "this cut was seen" is monotone in the
cut's position and a binary search finds the longest seen cut in about log2(cuts)
hashes. Registration is one streaming pass over the text.

Block hashes ride along: the returned ``PromptIds`` carries the matched prompt's block
hashes, so ``infera.kv.hashing.block_hashes`` hashes only the new blocks (the hash of
block k depends only on tokens 0..k).

Memory is bounded by ``max_bytes`` (default 64 MiB, least recently used prompts go
first), counted as text bytes + 40 bytes a token id + 48 bytes a block hash; a prompt
that a later one extends is dropped as soon as no cut points at it any more, so a
growing conversation holds one entry.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

import xxhash

from infera.kv.hashing import PromptIds

DEFAULT_MAX_BYTES = 64 << 20
MIN_CHARS = 1024  # shorter prompts are cheaper to encode than to look up
_BYTES_PER_ID = 40  # list slot + int object
_BYTES_PER_HASH = 48

_xxh3 = xxhash.xxh3_64_intdigest


class _Entry:
    __slots__ = ("cuts", "data", "hashes", "ids", "refs", "size")

    def __init__(self, data: bytes, ids: list[int], cuts: list[tuple[int, int, int]]) -> None:
        self.data = data
        self.ids = ids
        self.cuts = cuts  # (byte offset, key, ids before it), ascending
        self.hashes: dict[int, list[int]] = {}  # block size -> chained block hashes, filled by block_hashes
        self.refs = 0  # keys in the index that point here
        self.size = len(data) + _BYTES_PER_ID * len(ids)


class PromptCache:
    """Encode prompts through ``encode``, reusing the ids of the longest prefix seen before.

    ``encode(text)`` must be a codec call without added special tokens, and ``boundaries``
    (token -> id) added tokens it splits on before anything else. Thread-safe.
    """

    def __init__(self, encode: Callable[[str], list[int]], boundaries: Mapping[str, int],
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if not boundaries:
            raise ValueError("a prompt cache needs the codec's boundary tokens")
        self._encode = encode
        names = sorted((t.encode("utf-8") for t in boundaries), key=len, reverse=True)
        self._regex = re.compile(b"|".join(map(re.escape, names)))  # longest first, as the codecs match
        self._names = frozenset(names)
        # ChatML-like tokens (b"<" ... b">", no b">" inside) are found with bytes.find alone
        first, last = names[0][:1], names[0][-1:]
        delimited = all(n[:1] == first and n[-1:] == last and n.count(last) == 1 and len(n) > 1 for n in names)
        self._delims = (first, last) if delimited else None
        self._id_of = {t.encode("utf-8"): i for t, i in boundaries.items()}
        self.max_bytes = max_bytes
        self.min_chars = MIN_CHARS  # shorter prompts are encoded directly
        self._keys: dict[int, tuple[_Entry, int]] = {}  # cut key -> (entry, index into entry.cuts)
        self._lru: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0  # prompts that reused a prefix
        self.reused_tokens = 0
        self.encoded_tokens = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def entries(self) -> int:
        return len(self._lru)

    def encode(self, text: str) -> list[int]:
        """``self._encode(text)``, computed from the longest cached prefix plus the new rest."""
        if len(text) < self.min_chars:
            return self._encode(text)
        data = text.encode("utf-8", "surrogatepass")
        matches = self._matches(data)
        n = len(data)
        # usable cuts of this text: the next character cannot merge back (ASCII or end of text)
        usable = [e for e, _ in matches if e == n or data[e] < 0x80]
        with self._lock:
            found = self._longest(data, usable)
            if found is not None:
                self._lru.move_to_end(id(found[0]))
        if found is None:
            base, start, before, hashes = None, 0, [], None
            ids = self._encode(text)
        else:
            base, k = found
            start, _, n_ids = base.cuts[k]
            before = base.cuts[: k + 1]
            rest = self._encode(data[start:].decode("utf-8", "surrogatepass")) if start < n else []
            ids = base.ids[:n_ids] + rest
            hashes = {size: h[: n_ids // size] for size, h in base.hashes.items()}
        entry = self._entry(data, ids, matches, start, before)
        if entry is not None:
            with self._lock:
                self._store(entry)
                if base is not None:
                    self.hits += 1
                    self.reused_tokens += before[-1][2]
                self.encoded_tokens += len(ids) - (before[-1][2] if before else 0)
        out = PromptIds(ids)
        out.origin = ids
        out.known_hashes = hashes
        out.sink = entry.hashes if entry is not None else None
        return out

    # -- internals -----------------------------------------------------------------------

    def _matches(self, data: bytes) -> list[tuple[int, bytes]]:
        """(end offset, token) of each boundary token in ``data``, leftmost-longest as the codecs split."""
        if self._delims is None:
            return [(m.end(), m.group()) for m in self._regex.finditer(data)]
        first, last = self._delims
        names = self._names
        out: list[tuple[int, bytes]] = []
        find = data.find
        i = find(first)
        while i >= 0:  # a token starting at i can only end at the next ``last``
            j = find(last, i + 1)
            if j < 0:
                break
            token = data[i : j + 1]
            if token in names:
                out.append((j + 1, token))
                i = find(first, j + 1)
            else:
                i = find(first, i + 1)
        return out

    def _longest(self, data: bytes, usable: list[int]) -> tuple[_Entry, int] | None:
        """The entry and cut index of the longest usable cut of ``data`` seen before."""
        view = memoryview(data)
        keys = self._keys
        lo, hi = 0, len(usable)  # binary search: cuts seen form a prefix of the usable ones
        best: tuple[_Entry, int] | None = None
        while lo < hi:
            mid = (lo + hi) // 2
            end = usable[mid]
            hit = keys.get(_xxh3(view[:end]))
            if hit is not None and hit[0].cuts[hit[1]][0] == end and hit[0].data.startswith(view[:end]):
                best = hit
                lo = mid + 1
            else:
                hi = mid
        return best

    def _entry(self, data: bytes, ids: list[int], matches: list[tuple[int, bytes]], start: int,
               before: list[tuple[int, int, int]]) -> _Entry | None:
        """The entry for ``data``: cuts up to ``start`` copied from the base, the rest found here.

        The id after each boundary token past ``start`` is found by scanning ``ids`` for that
        token's id in order (a boundary token's id comes only from its own text).
        """
        n = len(data)
        cuts = list(before)
        stream = xxhash.xxh3_64()
        view = memoryview(data)
        stream.update(view[:start])
        last = start
        pos = (before[-1][2] if before else 0) - 1
        id_of = self._id_of
        for end, token in matches:
            if end <= start:
                continue
            try:
                pos = ids.index(id_of[token], pos + 1)
            except ValueError:
                return None  # the codec did not split where expected: do not remember this prompt
            stream.update(view[last:end])
            last = end
            if end == n or data[end] < 0x80:
                cuts.append((end, stream.intdigest(), pos + 1))
        return _Entry(data, ids, cuts)

    def _store(self, entry: _Entry) -> None:
        keys = self._keys
        lru = self._lru
        for k, cut in enumerate(entry.cuts):
            old = keys.get(cut[1])
            keys[cut[1]] = (entry, k)
            if old is not None:
                prev = old[0]
                prev.refs -= 1
                if prev.refs == 0 and lru.pop(id(prev), None) is not None:
                    self._bytes -= prev.size  # a later prompt covers all of it
        entry.refs += len(entry.cuts)
        lru[id(entry)] = entry
        self._bytes += entry.size
        while self._bytes > self.max_bytes and len(lru) > 1:
            _, victim = lru.popitem(last=False)
            self._bytes -= victim.size
            for _, key, _ in victim.cuts:
                hit = keys.get(key)
                if hit is not None and hit[0] is victim:
                    del keys[key]
