"""Codecs: text <-> token ids, for the tokenizer files an engine loads.

``HfCodec`` runs the ``tokenizers`` library on ``tokenizer.json``. A vocabulary converted
from tiktoken (Qwen, Llama 3, ...) is encoded by ``TiktokenCodec`` instead when
``tiktoken_spec`` proves it gives the same ids (about 10x faster). ``ByteCodec`` is the
file-free fallback: one id per UTF-8 byte plus a few specials.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, Protocol

from tokenizers import Tokenizer

from infera.kv.bpe import table

BYTE_LEVEL_SPECIALS = {"<|im_start|>": 256, "<|im_end|>": 257, "<|endoftext|>": 258}


class Codec(Protocol):
    vocab_size: int
    # Added tokens (-> id) the codec splits text on before anything else, each section then
    # encoded on its own; empty when the codec does not guarantee that (see kv.prompt_cache).
    boundaries: dict[str, int]

    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


# ``Tokenizer.encode`` holds the GIL throughout (seconds for a multi-megabyte prompt, stalling the
# event loop even from a worker thread); ``encode_batch`` releases it and gives the same ids.
GIL_FREE_CHARS = 16 * 1024


class HfCodec:
    """A ``tokenizers.Tokenizer``, with transformers' explicit add_bos/add_eos override."""

    def __init__(self, tok: Tokenizer, bos_id: int | None, eos_id: int | None, explicit: bool,
                 boundaries: dict[str, int] | None = None) -> None:
        self._tok = tok
        self.boundaries = dict(boundaries or {})
        self._encode = tok.encode
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        # transformers >= 5 replaces the post-processor when tokenizer_config.json sets
        # add_bos_token/add_eos_token explicitly; otherwise tokenizer.json's post-processor rules.
        self._explicit = explicit
        self._bos = [bos_id] if bos_id is not None else []
        self._eos = [eos_id] if eos_id is not None else []

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if add_special_tokens and self._explicit:
            return self._bos + self._ids(text, False) + self._eos
        return self._ids(text, add_special_tokens)

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) >= GIL_FREE_CHARS:
            ids: list[int] = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
            return ids
        return self._encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


SEGMENT_CACHE_MIN_CHARS = 128  # shorter text between special tokens is cheaper to encode than to look up
SEGMENT_CACHE_ENTRIES = 4096


class TiktokenCodec:
    """tiktoken's BPE for a tokenizer.json converted from a tiktoken vocabulary (Qwen, Llama 3, ...).

    About 10x faster than ``tokenizers`` on the same text. Used only for encoding without
    added special tokens (the chat path), and only when ``tiktoken_spec`` proves that the
    tokenizer.json's merges are exactly tiktoken's rank rule; anything else goes to ``hf``.

    Text between special tokens is encoded independently (tiktoken, like ``tokenizers``
    with plain added tokens, splits on them first), so each such segment's ids are cached:
    a system prompt shared by many requests, or the earlier turns of a conversation, are
    encoded once. The cache is bounded (oldest entries go first).
    """

    def __init__(self, hf: HfCodec, spec: TiktokenSpec) -> None:
        import tiktoken

        self._hf = hf
        self._nfc = spec.nfc
        self._enc = tiktoken.Encoding(
            "infera", pat_str=spec.pattern, mergeable_ranks=spec.ranks, special_tokens=spec.specials
        )
        self._encode = self._enc.encode
        # the same ids, in C for ASCII text when the pattern is one csrc/bpe.c knows (~6x faster on a chat turn)
        self._table = table(spec.pattern, spec.ranks, self._enc.encode_ordinary)
        self._ordinary = self._table.encode if self._table is not None else self._enc.encode_ordinary
        self._special_ids = dict(spec.specials)
        # what ``allowed_special="all"`` stands for, taken once: with it and nothing disallowed, tiktoken skips
        # building ``all - allowed`` (an empty set) on every short encode
        self._all_special = self._enc.special_tokens_set
        names = sorted(spec.specials, key=len, reverse=True)
        self._split: Callable[[str], list[str]] | None = (
            re.compile("(" + "|".join(map(re.escape, names)) + ")").split if names else None)
        self._delims = ("", "")
        # ChatML-like specials (one first and one last character, the last nowhere else in any): split with
        # str.find, the same pieces as the regex's (~0.5 µs instead of ~2 on a ~900-character turn: the regex
        # tries every special's alternative at each character)
        if names and all(len(n) > 1 and n[0] == names[0][0] and n[-1] == names[0][-1] and n.count(n[-1]) == 1
                         for n in names):
            self._split = self._split_delimited
            self._delims = (names[0][0], names[0][-1])
        # encode_fresh_packed: the split and the pieces in one C call (ChatML-like specials and the C table only)
        self._packed = self._table.encode_chat if self._table is not None and self._delims[0] else None
        # oldest first out: an OrderedDict pops its first item in O(1); a dict's ``next(iter(d))`` walks over the
        # slots its earlier deletions left (~2 µs a unique turn at 4096 entries)
        self._segments: OrderedDict[str, list[int]] = OrderedDict()
        self.vocab_size = hf.vocab_size
        self.boundaries = nested_free(spec.specials)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if add_special_tokens:
            return self._hf.encode(text, True)
        return self._segmented(text, self._segments)

    def encode_fresh(self, text: str) -> list[int]:
        """``encode(text, False)`` without the segment cache: for text the caller knows to be new (the prompt
        cache's tail past its longest seen cut, mostly a unique user turn). Looking such a segment up misses, and
        keeping it evicts a segment that could hit and holds its list of ints (~2 µs a request, bench/README.md
        "Issue 15, tenth round ... ctx12"). The same ids: the cache only ever holds ``self._ordinary(piece)``."""
        return self._segmented(text, None)

    @property
    def fresh_packer(self) -> Callable[[str], bytes] | None:
        """:meth:`encode_fresh` with its ids as the bytes of a uint32 array (native order), in one C call
        (csrc/bpe.c's ``encode_chat``: the same split on the specials, the same ``ordinary`` per piece; a short
        text too, which :meth:`encode_fresh` gives tiktoken whole, for the same ids: tiktoken splits on the
        specials the same way); None when this codec cannot (no C table, or specials the split needs a regex
        for)."""
        return self._pack_fresh if self._packed is not None else None

    def fresh_packer_call(self) -> tuple[Callable[..., bytes], str, str, dict[str, int]] | None:
        """:meth:`fresh_packer`'s C call and the arguments after the text, ``(call, first, last, specials)``: for an
        ASCII text (which NFC leaves as it is) ``call(text, first, last, specials) == fresh_packer()(text)`` with no
        Python frame in between (the prompt cache's C calls it so for an ASCII tail); None when there is no packer."""
        if self._packed is None:
            return None
        first, last = self._delims
        return self._packed, first, last, self._special_ids

    def _pack_fresh(self, text: str) -> bytes:
        packed = self._packed
        assert packed is not None
        if self._nfc and not text.isascii():
            text = unicodedata.normalize("NFC", text)
        first, last = self._delims
        return packed(text, first, last, self._special_ids)

    def _segmented(self, text: str, cache: OrderedDict[str, list[int]] | None) -> list[int]:
        """The ids of ``text`` without added special tokens, section by section between special tokens; a long
        section's ids through ``cache`` when one is given."""
        if self._nfc and not text.isascii():
            text = unicodedata.normalize("NFC", text)
        if self._split is None or len(text) < SEGMENT_CACHE_MIN_CHARS:
            return self._encode(text, allowed_special=self._all_special, disallowed_special=())
        out: list[int] = []
        ordinary = self._ordinary
        for i, piece in enumerate(self._split(text)):
            if i % 2:
                out.append(self._special_ids[piece])
            elif cache is None or len(piece) < SEGMENT_CACHE_MIN_CHARS:
                if piece:
                    out.extend(ordinary(piece))
            else:
                ids = cache.get(piece)
                if ids is None:
                    ids = ordinary(piece)
                    if len(cache) >= SEGMENT_CACHE_ENTRIES:
                        cache.popitem(last=False)
                    cache[piece] = ids
                out.extend(ids)
        return out

    def _split_delimited(self, text: str) -> list[str]:
        """``re.split`` of ``text`` on the specials, captured (text, special, text, ..., text), for specials that
        all start with one character and end with another found nowhere else in them: a special starting at ``i``
        can only end at the first end character after ``i``, so one ``in`` per start character decides."""
        first, last = self._delims
        names = self._special_ids
        out: list[str] = []
        find = text.find
        pos = 0  # where the current text piece starts
        i = find(first)
        while i >= 0:
            j = find(last, i + 1)
            if j < 0:
                break
            token = text[i : j + 1]
            if token in names:
                out.append(text[pos:i])
                out.append(token)
                pos = j + 1
                i = find(first, pos)
            else:
                i = find(first, i + 1)
        out.append(text[pos:])
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._hf.decode(ids, skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)


def nested_free(tokens: dict[str, int]) -> dict[str, int]:
    """``tokens``, or {} when one contains another (a cut after the inner one could split the outer)."""
    if any(a != b and a in b for a in tokens for b in tokens):
        return {}
    return dict(tokens)


_SECTION_SAFE_PRE = frozenset({"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit"})


def hf_boundaries(data: dict[str, Any], split_special_tokens: bool) -> dict[str, int]:
    """Added tokens a parsed tokenizer.json splits on first, with sections encoded independently.

    True of ``tokenizers`` when added tokens are matched on the raw text (not normalised,
    no lstrip/rstrip/single_word) and nothing depends on a section's place in the text
    (no normaliser but NFC, pre-tokenizers from a position-free set: not Metaspace, whose
    ``prepend_scheme="first"`` treats the first section differently). {} otherwise.
    """
    if split_special_tokens:
        return {}
    normalizer = data.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return {}
    pre = data.get("pre_tokenizer") or {}
    pres = pre.get("pretokenizers", ()) if pre.get("type") == "Sequence" else ([pre] if pre else [])
    if any(p.get("type") not in _SECTION_SAFE_PRE for p in pres):
        return {}
    tokens: dict[str, int] = {}
    for added in data.get("added_tokens", ()):
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            return {}
        if added.get("normalized") and normalizer is not None:
            return {}
        tokens[added["content"]] = added["id"]
    return nested_free(tokens)


@dataclasses.dataclass(slots=True)
class TiktokenSpec:
    pattern: str
    ranks: dict[bytes, int]
    specials: dict[str, int]
    nfc: bool


_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def tiktoken_spec(data: dict[str, Any]) -> TiktokenSpec | None:
    """The tiktoken equivalent of a parsed tokenizer.json, or None when it is not exactly one.

    Exact means: byte-level BPE with ``ignore_merges``, a Split(regex) + ByteLevel
    pre-tokenizer (or ByteLevel with GPT-2's regex), no normaliser or NFC, plain added
    tokens, and merges that are complete and ordered by the merged token's id, so that
    "merge the adjacent pair with the lowest merge rank" equals tiktoken's "merge the
    adjacent pair whose concatenation has the lowest rank". (Both then differ only when
    two overlapping pairs produce the same token, e.g. ab+a and a+ba; such vocabularies
    are vanishingly rare and it costs a cache hit, not correctness.)
    """
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not model.get("ignore_merges") or model.get("dropout"):
        return None
    if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    normalizer = data.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    pre = data.get("pre_tokenizer") or {}
    pattern: str | None = None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex") and not pre.get("add_prefix_space"):
        pattern = _GPT2_PATTERN
    elif pre.get("type") == "Sequence" and len(pre.get("pretokenizers", ())) == 2:
        split, level = pre["pretokenizers"]
        if (
            split.get("type") == "Split" and "Regex" in split.get("pattern", {})
            and split.get("behavior") == "Isolated" and not split.get("invert")
            and level.get("type") == "ByteLevel" and not level.get("use_regex") and not level.get("add_prefix_space")
        ):
            pattern = split["pattern"]["Regex"]
    if pattern is None:
        return None
    specials: dict[str, int] = {}
    for added in data.get("added_tokens", ()):
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            return None
        specials[added["content"]] = added["id"]
    if any(a != b and b.startswith(a) for a in specials for b in specials):
        return None  # tiktoken would not pick the longest of overlapping added tokens
    vocab: dict[str, int] = model.get("vocab", {})
    decoder = _byte_decoder()
    if any(ch not in vocab for ch in decoder):
        return None
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model.get("merges", ())]
    merged_ranks = [vocab.get(left + right, -1) for left, right in merges]
    if -1 in merged_ranks or any(a > b for a, b in pairwise(merged_ranks)):
        return None
    pairs = set(merges)
    # Every split of every token into two tokens must be a merge (~1 s for a 150k vocabulary).
    for token in vocab:
        for i in range(1, len(token)):
            left = token[:i]
            if left in vocab:
                right = token[i:]
                if right in vocab and (left, right) not in pairs:
                    return None
    to_latin1 = str.maketrans({ch: chr(b) for ch, b in decoder.items()})
    try:
        ranks = {token.translate(to_latin1).encode("latin-1"): rank for token, rank in vocab.items()}
    except UnicodeEncodeError:  # a char outside the byte-level alphabet
        return None
    return TiktokenSpec(pattern, ranks, specials, normalizer is not None)


class ByteCodec:
    """UTF-8 bytes as ids 0..255, plus a few special tokens above them."""

    def __init__(self, specials: dict[str, int]) -> None:
        self._specials = dict(specials)
        self._by_id = {i: t for t, i in specials.items()}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in specials) + ")")
        self.vocab_size = 256 + len(specials)
        self.boundaries = nested_free(specials)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids: list[int] = []
        specials = self._specials
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:
                ids.append(specials[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            if 0 <= i < 256:
                buf.append(i)
                continue
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
            token = self._by_id.get(i)
            if token is not None and not skip_special_tokens:
                out.append(token)
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        return self._specials.get(token)
