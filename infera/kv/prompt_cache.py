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
Every stored prompt's cuts are keyed (those it shares with the prompt it was made from stay
keyed to that one, which the lookup just found: a fresh turn off a shared prefix keys only
its own), so "this cut was seen" is monotone in the cut's position and a binary search finds
the longest seen cut in about log2(cuts) hashes. Registration is one streaming pass over
the new text: a prompt that extends a stored one from its last cut resumes that one's hash
state, and one made from an earlier cut resumes the state the stored prompt kept for the
cut it was last branched off from. The next turn's probes from
the end use a second key, xxh3 of the 64 bytes before the cut seeded with its offset (one
int, no tuple to build, hash and compare per probe or registration), so each
costs O(64), and a hit is confirmed by comparing the whole prefix (a memcmp).

Block hashes ride along: the returned ``PromptIds`` carries the matched prompt's block
hashes, so ``infera.kv.hashing.block_hashes`` hashes only the new blocks (the hash of
block k depends only on tokens 0..k).

Memory is bounded by ``max_bytes`` (default 64 MiB, least recently used prompts go
first), counted as text bytes + 4 bytes a token id (block hashes, one per 16+ tokens,
and the cut keys add ~10-20%); a prompt that a later one extends as a whole is dropped at
once, so a growing conversation holds one entry.

An entry keeps its ids as an ``array('I')``, not a list: no int object per id, nothing for
the cyclic GC to visit (a young collection visited every id of every prompt stored since
the last one: ~10 µs a request at 1k tokens), and an evicted prompt is freed in one piece.
Each caller gets its own list, built in C from the array with the vocabulary's int objects
(``vocab_size``: ids below it are shared objects, not allocated per request); the list's
``origin`` is the entry's array, which ``infera.kv.hashing`` compares it with (C) before
trusting the known block hashes, and hashes new blocks from (in place).
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from itertools import count, repeat

import xxhash

from infera.kv.hashing import ArrayIds, PromptIds, extend_hashes
from infera.kv.native import choose, load

DEFAULT_MAX_BYTES = 64 << 20
MIN_CHARS = 6000  # ~1.5k tokens: shorter prompts cost less encoded directly (bench/prompt_sweep.py)
TAIL_PROBES = 8  # seen cuts looked for from the end before a full scan
TAIL_WINDOW = 64  # bytes before a cut that, hashed with its offset as the seed, key it in ``_ends``
_BYTES_PER_ID = 4  # array('I')
IDS = "I"  # the entries' array type: uint32 (4 bytes on every platform CPython supports; checked below)

_xxh3 = xxhash.xxh3_64_intdigest
_native = load()  # u32_fill (C), or None: see infera.kv.native (the default of a PromptCache's ``native``)
if array(IDS).itemsize != 4:
    raise ImportError("array('I') is not 4 bytes here")


class _Entry:
    __slots__ = ("branch", "cuts", "data", "ends", "first", "hashes", "holder", "ids", "size", "state")

    def __init__(self, data: bytes, ids: array[int], cuts: list[tuple[int, int, int, int]]) -> None:
        self.data = data
        self.ids = ids
        self.cuts = cuts  # (byte offset, key, ids before it, its ``_ends`` key), ascending
        self.hashes: dict[int, list[int]] = {}  # block size -> chained block hashes, filled by block_hashes
        # what the index's keys hold: a prompt that extends this one as a whole takes the
        # holder over, so the cuts they share move to it in O(1)
        self.holder = [self]
        # the cuts from this index on are keyed to ``holder`` (those before it share with the prompt this one was
        # made from: their keys lead there)
        self.first = 0
        # xxh3 state after ``data[:cuts[-1][0]]``: a prompt extending this one hashes only its new bytes (the C
        # path's: an XXH3_state_t's bytes, which only it reads)
        self.state: xxhash.xxh3_64 | bytes | None = None
        # (k, the state after ``data[:cuts[k][0]]``) for the last cut a prompt branched off from before the last one
        # (the fresh turns off a shared prefix: the next one hashes only its own bytes, not the ~6 KB prefix again)
        self.branch: tuple[int, xxhash.xxh3_64 | bytes] | None = None
        self.size = len(data) + _BYTES_PER_ID * len(ids)


class PromptCache:
    """Encode prompts through ``encode``, reusing the ids of the longest prefix seen before.

    ``encode(text)`` must be a codec call without added special tokens (``encode_tail``, if given, the same ids:
    what the text past a reused prefix goes through), and ``boundaries``
    (token -> id) added tokens it splits on before anything else. ``vocab_size``: ids below
    it reach callers as shared int objects (a tuple of them, ~36 bytes an id, made here).
    ``native``: the per-request bookkeeping in C (``infera.kv._native``: True, ImportError if it is not built),
    in Python (False), or C when built unless ``INFERA_PURE_PYTHON`` (None); the same ids, keys and eviction
    order either way (tests/kv/test_prompt_cache.py). ``encode_tail_packed``, if given: ``encode_tail``'s ids
    as the bytes of a uint32 array (native order), which the C path appends to the entry's array as they are
    (no list of ints built and packed again; bench/README.md "Issue 15, thirteenth round ... ctx15").
    ``encode_tail_call``, if given with it: ``(call, *rest)`` with ``call(tail, *rest) == encode_tail_packed(tail)``
    for an ASCII tail, which the C path then calls itself (no Python frame between; "eighteenth round ... ctx20").
    Thread-safe.
    """

    def __init__(self, encode: Callable[[str], list[int]], boundaries: Mapping[str, int],
                 max_bytes: int = DEFAULT_MAX_BYTES, vocab_size: int = 0, native: bool | None = None,
                 encode_tail: Callable[[str], list[int]] | None = None,
                 encode_tail_packed: Callable[[str], bytes] | None = None,
                 encode_tail_call: tuple[Callable[..., bytes], str, str, Mapping[str, int]] | None = None) -> None:
        if not boundaries:
            raise ValueError("a prompt cache needs the codec's boundary tokens")
        self._encode = encode
        # the text past a reused prefix (new text: a codec's caches of earlier text would miss on it), the same ids
        self._encode_tail = encode_tail or encode
        self._native = _native if native is None else choose(native)
        self._ints = tuple(range(vocab_size)) if self._native is not None else ()
        names = sorted((t.encode("utf-8") for t in boundaries), key=len, reverse=True)
        self._regex = re.compile(b"|".join(map(re.escape, names)))  # longest first, as the codecs match
        self._names = frozenset(names)
        # ChatML-like tokens (b"<" ... b">", no b">" inside) are found with bytes.find alone
        first, last = names[0][:1], names[0][-1:]
        delimited = all(n[:1] == first and n[-1:] == last and n.count(last) == 1 and len(n) > 1 for n in names)
        self._delims = (first, last) if delimited else None
        self._id_of = {t.encode("utf-8"): i for t, i in boundaries.items()}
        # the C path's view of the same: the tokens longest first, their ids, the delimiting bytes as ints
        self._names_t = tuple(names)
        self._tokens = tuple(self._id_of[t] for t in names)
        self._bounds = (first[0], last[0]) if delimited and self._native is not None else None
        # only where the entry's cuts are found in C from its array (the Python path reads the tail's ids as a list)
        self._encode_packed = encode_tail_packed if self._bounds is not None else None
        # what prompt_extend is given: the packer, or (the packer, the C call an ASCII tail goes to, its arguments)
        self._packer: Callable[[str], bytes] | tuple[object, ...] | None = self._encode_packed
        if self._encode_packed is not None and encode_tail_call is not None:
            self._packer = (self._encode_packed, *encode_tail_call)
        self.max_bytes = max_bytes
        self.min_chars = MIN_CHARS  # shorter prompts are encoded directly
        self._keys: dict[int, tuple[list[_Entry], int]] = {}  # cut key -> (entry holder, index into its cuts)
        # xxh3 of the TAIL_WINDOW bytes before each cut, seeded with its offset -> as _keys: a probe from the end
        # costs O(window), not a hash of the whole prefix (bench/README.md, "the prompt cache's reuse"); a
        # collision costs a miss (a hit is confirmed by its offset and bytes), never a wrong id
        self._ends: dict[int, tuple[list[_Entry], int]] = {}
        self._lru: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry
        self._sizes: set[int] = set()  # block sizes whose hashes callers asked for: made with the ids from now on
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
        out = self.encode_within(text, None)
        assert isinstance(out, list)
        return out

    def encode_within(self, text: str, most: int | None, listed: bool = True) -> Sequence[int] | None:
        """:meth:`encode`, or None (having done nothing) when more than ``most`` UTF-8 bytes of ``text``
        are not cached: the caller then encodes it elsewhere (a worker thread). ``most`` None: no bound.

        ``listed`` False: a prompt the cache keeps comes back as an :class:`ArrayIds` over the entry's
        own array (no list of ~1k ints built per request; the router's context only counts and hashes
        the ids), else as a ``PromptIds`` list. Either way the same ids."""
        if len(text) < self.min_chars:
            return self._encode(text)
        data = text.encode("utf-8", "surrogatepass")
        n = len(data)
        bounds = self._bounds
        probed = bounds is not None and self._encode_packed is not None
        if probed:  # the C path with a packer, a recent cut (the next turn): no _find, _tail_hit frames
            with self._lock:
                found = self._native.prompt_tail(  # type: ignore[union-attr]
                    data, *bounds, self._names_t, self._ends, self._keys, TAIL_WINDOW, TAIL_PROBES)  # type: ignore[misc]
                if found is not None:
                    if most is not None and n - found[0].cuts[found[1]][0] > most:
                        return None
                    if id(found[0]) in self._lru:
                        self._lru.move_to_end(id(found[0]))
            if found is not None:
                return self._extend_native(data, found[0], found[1], listed)
        with self._lock:
            found, scanned = self._find(data, not probed)
            if most is not None and n - (found[0].cuts[found[1]][0] if found is not None else 0) > most:
                return None
            if found is not None and id(found[0]) in self._lru:
                self._lru.move_to_end(id(found[0]))
        k = -1
        out: PromptIds | None = None  # built only for a caller that takes a list
        native = self._native
        if found is None:
            base, start, before, known, offset = None, 0, [], {}, 0  # ``fresh`` holds the ids from ``offset`` on
            fresh = self._encode(text)
            try:
                ids = array(IDS, fresh)
            except (OverflowError, TypeError):  # not uint32: the caller gets its ids, nothing is stored
                return fresh
            if listed:
                out = PromptIds(fresh)
        else:
            base, k = found
            if self._encode_packed is not None:  # the C path: the rest of the hit in one call
                return self._extend_native(data, base, k, listed)
            start, _, offset, _ = base.cuts[k]
            before = base.cuts[: k + 1]
            tail = data[start:].decode("utf-8", "surrogatepass") if start < n else ""
            ids = base.ids[:offset]  # a memcpy
            packer = self._encode_packed
            fresh = []  # packed: not read (the entry's cuts come from ``ids``)
            if packer is not None:  # the tail's ids as uint32s in one C call, appended as they are
                ids.frombytes(packer(tail) if tail else b"")
            else:
                fresh = self._encode_tail(tail) if tail else []
                packed = native.u32_pack(fresh) if native is not None else None  # C: no int read one by one
                if packed is not None:
                    ids.frombytes(packed)
                else:
                    try:
                        ids.extend(fresh)
                    except (OverflowError, TypeError):
                        return self._encode(text)
            if listed:
                out = PromptIds()
                if native is not None:
                    native.u32_fill(out, ids, self._ints)
                else:
                    out += ids.tolist()
            known = base.hashes  # block size -> the base's hashes, of which those before ``offset`` ids are ours
            self._sizes.update(known)
        # every full block's hash for the sizes seen, from the array: the context takes them at once (no check that the
        # list still equals the array, no second pass), and the entry keeps its own copy for later prompts
        sizes = tuple(self._sizes)  # one C call: another thread may add a size meanwhile (encode runs off the loop too)
        complete = {size: extend_hashes(ids, known.get(size, []), size, offset // size) for size in sizes}
        state = self._state(base, k)
        if self._bounds is not None:
            entry = self._entry_native(data, ids, start, before, state, base, k)
        else:
            new = self._matches(data, start) if scanned is None else [m for m in scanned if m[0] > start]
            entry = self._entry(data, ids, fresh, offset, new, start, before, state, base, k)
        return self._finish(entry, base, k, ids, complete, out, known, offset)

    def _extend_native(self, data: bytes, base: _Entry, k: int, listed: bool) -> Sequence[int]:
        """:meth:`encode_within`'s lines after a hit on ``base``'s cut ``k`` (the C path with a packer): the tail's
        ids, the ids' copy, the block hashes and the new cuts in one C call (``_native.prompt_extend``), the same
        values as those lines (tests/kv/test_prompt_cache.py, test_prompt_cache_native.py)."""
        native = self._native
        bounds = self._bounds
        assert native is not None and bounds is not None
        before = base.cuts[: k + 1]
        start, _, offset, _ = before[-1]
        known = base.hashes
        self._sizes.update(known)
        state = self._state(base, k)
        ids, complete, got = native.prompt_extend(data, start, base.ids, offset, self._packer,
                                                  tuple(self._sizes), known, offset - 1, *bounds, self._names_t,
                                                  self._tokens, state, TAIL_WINDOW, k < len(base.cuts) - 1)
        out: PromptIds | None = None
        if listed:
            out = PromptIds()
            native.u32_fill(out, ids, self._ints)
        return self._finish(self._cut_entry(got, data, ids, before, base, k), base, k, ids, complete, out, known,
                            offset)

    @staticmethod
    def _state(base: _Entry | None, k: int) -> xxhash.xxh3_64 | bytes | None:
        """The xxh3 state after the reused prefix (``base``'s cut ``k``): the base's last cut's, or the one it keeps
        for the cut last branched off from; else None (hashed again, and kept for the next prompt made from that
        cut)."""
        if base is None:
            return None
        if k == len(base.cuts) - 1:
            return base.state
        branch = base.branch
        if branch is not None and branch[0] == k:
            return branch[1]
        return None

    def _finish(self, entry: _Entry | None, base: _Entry | None, k: int, ids: array[int],
                complete: dict[int, list[int]], out: PromptIds | None, known: Mapping[int, list[int]],
                offset: int) -> Sequence[int]:
        """Store ``entry`` (None: nothing), count, and the caller's ids: ``out`` filled in, or an ``ArrayIds``."""
        before = base.cuts[k][2] if base is not None else 0
        if entry is not None:
            with self._lock:
                self._store(entry, base, k)
                if base is not None:
                    self.hits += 1
                    self.reused_tokens += before
                self.encoded_tokens += len(ids) - before
            own = entry.hashes
            for size, h in complete.items():  # a loop: no generator per request
                own[size] = h.copy()
        if out is None:
            return ArrayIds(ids, complete, entry.hashes if entry is not None else None)
        out.origin = ids
        out.ints = self._ints
        out.known_hashes = {size: h[: offset // size] for size, h in known.items()} if base is not None else None
        out.sink = entry.hashes if entry is not None else None
        out.complete = complete
        return out

    def clear(self) -> None:
        """Forget every prompt (the counters stay)."""
        with self._lock:
            self._keys.clear()
            self._ends.clear()
            self._lru.clear()
            self._bytes = 0

    # -- internals -----------------------------------------------------------------------

    def _find(self, data: bytes, tail: bool = True) -> tuple[tuple[_Entry, int] | None, list[tuple[int, bytes]] | None]:
        """(entry, cut index) of the longest seen cut of ``data``, and the boundary matches when a full
        scan found them (None after a tail hit; ``tail`` False: the tail was probed already). Under the lock."""
        found = self._tail_hit(data) if tail else None
        if found is not None:
            return found, None
        # no recent turn: the longest seen cut anywhere (shared system prompt)
        n = len(data)
        scanned = self._matches(data, 0)
        return self._longest(data, [e for e, _ in scanned if e == n or data[e] < 0x80]), scanned

    def _matches(self, data: bytes, start: int) -> list[tuple[int, bytes]]:
        """(end offset, token) of each boundary token in ``data[start:]``, leftmost-longest.

        ``start`` is 0 or a cut: no token spans a cut (none contains another), so scanning
        from it finds what a scan from 0 finds past it.
        """
        if self._delims is None:
            return [(m.end(), m.group()) for m in self._regex.finditer(data, start)]
        first, last = self._delims  # memchr-fast: cost grows with the tokens, not the bytes
        names = self._names
        out: list[tuple[int, bytes]] = []
        find = data.find
        i = find(first, start)
        while i >= 0:
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

    def _tail_hit(self, data: bytes) -> tuple[_Entry, int] | None:
        """A seen cut among the last few of ``data``, found scanning backwards (the next turn's case).

        Only for ChatML-like tokens (``<...>``). Candidates are only probes: a hit is a
        registered cut at the same offset with the same bytes before it, which makes it real.
        """
        if self._delims is None:
            return None
        if self._bounds is not None:
            found: tuple[_Entry, int] | None = self._native.prompt_tail(  # type: ignore[union-attr]
                data, *self._bounds, self._names_t, self._ends, self._keys, TAIL_WINDOW, TAIL_PROBES)
            return found
        first, last = self._delims
        names = self._names
        n = len(data)
        view = memoryview(data)
        ends = self._ends
        hi = n
        probes: list[int] = []
        for _ in range(4 * TAIL_PROBES):
            j = data.rfind(last, 0, hi)
            i = data.rfind(first, 0, j) if j > 0 else -1
            if i < 0:
                break
            hi = j
            end = j + 1
            if (end < n and data[end] >= 0x80) or data[i:end] not in names:
                continue
            got = ends.get(_xxh3(view[max(0, end - TAIL_WINDOW) : end], seed=end))
            if got is not None and got[0]:
                entry, k = got[0][0], got[1]
                if entry.cuts[k][0] == end and entry.data.startswith(view[:end]):  # exact: a memcmp
                    return entry, k
                hit = self._hit(view, end)  # another prompt with those bytes there: the whole prefix's key
                if hit is not None:
                    return hit
            probes.append(end)
            if len(probes) == TAIL_PROBES:
                break
        for end in probes:  # a cut whose short key another prompt's overwrote, then lost (evicted)
            hit = self._hit(view, end)
            if hit is not None:
                return hit
        return None

    def _hit(self, view: memoryview, end: int) -> tuple[_Entry, int] | None:
        hit = self._keys.get(_xxh3(view[:end]))
        if hit is None:
            return None
        entry, k = hit[0][0], hit[1]
        if entry.cuts[k][0] == end and entry.data.startswith(view[:end]):
            return entry, k
        return None

    def _longest(self, data: bytes, usable: list[int]) -> tuple[_Entry, int] | None:
        """The entry and cut index of the longest usable cut of ``data`` seen before."""
        view = memoryview(data)
        lo, hi = 0, len(usable)  # binary search: cuts seen form a prefix of the usable ones
        best: tuple[_Entry, int] | None = None
        while lo < hi:
            mid = (lo + hi) // 2
            hit = self._hit(view, usable[mid])
            if hit is not None:
                best = hit
                lo = mid + 1
            else:
                hi = mid
        return best

    def _entry(self, data: bytes, ids: array[int], fresh: list[int], offset: int, matches: list[tuple[int, bytes]],
               start: int, before: list[tuple[int, int, int, int]], state: xxhash.xxh3_64 | bytes | None,
               base: _Entry | None, k: int) -> _Entry | None:
        """The entry for ``data`` (``ids``; ``fresh``: the same from ``ids[offset]`` on, as a list, ``offset`` the
        ids before ``start``): cuts up to ``start`` copied from the base, the rest found here.

        The id after each boundary token past ``start`` is found by scanning ``fresh`` for that
        token's id in order (a boundary token's id comes only from its own text). ``state``: the
        base's xxh3 state after its last cut, given only when that cut is ``start`` (the bytes it
        covers equal ``data[:start]``, compared on the hit): those bytes are not hashed again. Else they are, and
        the state after them is kept as ``base.branch`` (``base``'s cut ``k`` ends at ``start``).
        """
        n = len(data)
        cuts = list(before)
        view = memoryview(data)
        if isinstance(state, xxhash.xxh3_64):
            stream = state.copy()  # the base keeps its own: another prompt may extend it too
        else:
            stream = xxhash.xxh3_64()
            stream.update(view[:start])
            if base is not None and k < len(base.cuts) - 1:
                base.branch = (k, stream.copy())
        last = start
        pos = (before[-1][2] if before else 0) - 1
        id_of = self._id_of
        for end, token in matches:
            if end <= start:
                continue
            try:
                pos = fresh.index(id_of[token], pos + 1 - offset) + offset  # a list's index: no int made per item
            except ValueError:
                return None  # the codec did not split where expected: do not remember this prompt
            stream.update(view[last:end])
            last = end
            if end == n or data[end] < 0x80:
                cuts.append((end, stream.intdigest(), pos + 1, _xxh3(view[max(0, end - TAIL_WINDOW) : end], seed=end)))
        entry = _Entry(data, ids, cuts)
        if cuts and last == cuts[-1][0]:
            entry.state = stream
        return entry

    def _entry_native(self, data: bytes, ids: array[int], start: int, before: list[tuple[int, int, int, int]],
                      state: xxhash.xxh3_64 | bytes | None, base: _Entry | None, k: int) -> _Entry | None:
        """:meth:`_matches` past ``start`` and :meth:`_entry` in one C call (``_native.prompt_cuts``): the same cuts
        (the boundary tokens' ids looked for in ``ids`` past the ``before`` cuts' ids), the states as bytes."""
        assert self._native is not None and self._bounds is not None
        snap = base is not None and k < len(base.cuts) - 1
        got = self._native.prompt_cuts(data, start, ids, (before[-1][2] if before else 0) - 1, *self._bounds,
                                       self._names_t, self._tokens, state, TAIL_WINDOW, snap)
        return self._cut_entry(got, data, ids, before, base, k)

    @staticmethod
    def _cut_entry(got: tuple[list[tuple[int, int, int, int]], int, bytes, bytes | None] | None, data: bytes,
                   ids: array[int], before: list[tuple[int, int, int, int]], base: _Entry | None,
                   k: int) -> _Entry | None:
        """The entry from ``_native.prompt_cuts``' answer ``got`` (None: not remembered)."""
        if got is None:
            return None  # the codec did not split where expected: do not remember this prompt
        new, last, stream, at_start = got
        if at_start is not None:
            base.branch = (k, at_start)  # type: ignore[union-attr]  # snap: base is not None
        cuts = before + new
        entry = _Entry(data, ids, cuts)
        if cuts and last == cuts[-1][0]:
            entry.state = stream
        return entry

    def _store(self, entry: _Entry, base: _Entry | None, k: int) -> None:
        """Keep ``entry``, made from ``base``'s first ``k + 1`` cuts (or from scratch: None), and key its cuts past
        them; evict the least recently used prompts past the bound. Under the lock.

        A prompt that extends ``base`` as a whole (its last cut) replaces it: the holder, and with it the keys of the
        cuts they share, move to ``entry``. Any other prompt made from ``base`` leaves the keys of the cuts it shares
        with ``base`` leading there (``base`` is live: the lookup just found it): a fresh turn off a shared prefix
        keys only its own ~3 cuts, not the prefix's ~6 again, and its eviction looks up only those (a hit on the
        prefix then refreshes the prompt that first keyed it, which every such hit keeps in use)."""
        keys = self._keys
        lru = self._lru
        first = 0  # the cuts from this index on are keyed here (all: from scratch, or ``base`` evicted meanwhile)
        if base is not None and id(base) in lru:
            if k == len(base.cuts) - 1 and base.holder[0] is base:
                del lru[id(base)]
                self._bytes -= base.size
                entry.holder = base.holder
                entry.holder[0] = entry  # the shared cuts' keys now find ``entry``
                entry.first = base.first
                first = len(base.cuts)
            else:
                first = entry.first = k + 1
        cuts = entry.cuts
        ends = self._ends
        native = self._native
        if native is not None:
            native.prompt_store(keys, ends, entry.holder, cuts, first)
        else:
            places = list(zip(repeat(entry.holder, len(cuts) - first), count(first)))
            keys.update(zip([cut[1] for cut in cuts[first:]], places, strict=False))
            ends.update(zip([cut[3] for cut in cuts[first:]], places, strict=False))
        lru[id(entry)] = entry
        self._bytes += entry.size
        while self._bytes > self.max_bytes and len(lru) > 1:
            _, victim = lru.popitem(last=False)
            self._bytes -= victim.size
            if native is not None:
                native.prompt_evict(keys, ends, victim.holder, victim.cuts, victim.first)
            else:
                for _, key, _, tail in victim.cuts[victim.first :]:
                    hit = keys.get(key)
                    if hit is not None and hit[0] is victim.holder:
                        del keys[key]
                    got = ends.get(tail)
                    if got is not None and got[0] is victim.holder:
                        del ends[tail]
            # entry -> holder -> entry is a cycle: without this an evicted entry (its ids, ~1k ints) waited for
            # the cyclic GC, and every young collection re-scanned them (bench/README.md, sixth round)
            victim.holder = []
