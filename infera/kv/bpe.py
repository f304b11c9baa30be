"""tiktoken's ``encode_ordinary`` in C for ASCII text (``infera.kv._bpe``, csrc/bpe.c), for the pre-tokenizer
patterns of the cl100k family (Qwen2, Llama 3), with tiktoken as the reference and the fallback.

A chat's fresh user turn is mostly ASCII English: its pieces are split by a hand-written equivalent of the
pattern, looked up whole in a C table of the ranks and, when not a token, merged by tiktoken's rule; ~6x faster
than tiktoken on a ~135-token turn (bench/README.md, "Issue 15, ninth round: ... (helper tok11)"). Around each
non-ASCII character, tiktoken encodes the stretch between the nearest places where a piece always ends (a space
after an ASCII letter); CJK text without such places goes to tiktoken whole. Used only when the pattern string is
exactly one of ``PATTERN_DIGITS``, the C extension is built and ``INFERA_PURE_PYTHON`` is not set
(tests/kv/test_bpe.py checks the ids against tiktoken's).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

from infera.kv.native import ENV

# The split patterns csrc/bpe.c implements (tokenizer.json's Split regex), -> the longest digit run one piece takes.
_HEAD = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"""
_TAIL = r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
PATTERN_DIGITS: dict[str, int] = {
    _HEAD + r"\p{N}" + _TAIL: 1,  # Qwen2 / Qwen2.5 / Qwen3: one digit a piece
    _HEAD + r"\p{N}{1,3}" + _TAIL: 3,  # cl100k as converted to tokenizer.json, Llama 3: up to three
}


class Table(Protocol):
    """csrc/bpe.c's ``Bpe``: the ranks' table and the encoders over it."""

    def encode(self, text: str) -> list[int]:
        """tiktoken's ``encode_ordinary(text)``."""
        ...

    def encode_chat(self, text: str, first: str, last: str, specials: dict[str, int]) -> bytes:
        """The ids of ``text`` split on ``specials`` (all starting with the character ``first`` and ending with
        ``last``, found nowhere else in them), each piece between them through :meth:`encode`, as the bytes of
        a uint32 array (native order)."""
        ...


def table(pattern: str, ranks: dict[bytes, int], fallback: Callable[[str], list[int]]) -> Table | None:
    """The C table whose ``encode`` equals ``fallback`` (tiktoken's ``encode_ordinary`` for ``pattern`` and
    ``ranks``), or None when ``pattern`` is not a known one, the extension is not built or
    ``INFERA_PURE_PYTHON`` is set. Builds a table of the ranks (~15 ms, ~10 MB for 150k tokens)."""
    digits = PATTERN_DIGITS.get(pattern)
    if digits is None or os.environ.get(ENV, "0") not in ("", "0"):
        return None
    try:
        from infera.kv import _bpe
    except ImportError:
        return None
    made: Table = _bpe.Bpe(ranks, digits, fallback)
    return made


def ordinary(pattern: str, ranks: dict[bytes, int],
             fallback: Callable[[str], list[int]]) -> Callable[[str], list[int]] | None:
    """A function equal to ``fallback`` that runs in C on ASCII text (:func:`table`'s ``encode``), or None."""
    made = table(pattern, ranks, fallback)
    return made.encode if made is not None else None
