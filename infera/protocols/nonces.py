"""Removing per-request nonces from prompt text (``--strip-prompt-pattern``), cheaply when absent.

A pattern such as the default ``(?m)^x-anthropic-billing-header:[^\\n]*\\n?`` is tried by ``re`` at
every line of a system prompt: ~75 µs for 6 kB of text, on every request, nearly always to find
nothing. When a pattern can only match text containing a fixed string (its literal start, after
inline flags and a line or text anchor), a substring test skips the regex where the string is
absent; the result is the same either way.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

_FLAGS = re.compile(r"\(\?([aiLmsux]+)\)")
_META = frozenset(".^$*+?{}[]\\|()")
_OPTIONAL = frozenset("*?{")


@functools.lru_cache(maxsize=64)
def required_literal(pattern: re.Pattern[str]) -> str | None:
    """A string every match of ``pattern`` contains (its literal start), or None when unsure."""
    if pattern.flags & re.IGNORECASE:
        return None
    source = pattern.pattern
    flags = _FLAGS.match(source)
    if flags is not None:
        if "i" in flags.group(1) or "x" in flags.group(1):
            return None
        source = source[flags.end():]
    if source.startswith("^"):
        source = source[1:]
    elif source.startswith("\\A"):
        source = source[2:]
    end = 0
    while end < len(source) and source[end] not in _META:
        end += 1
    if end < len(source) and source[end] in _OPTIONAL:
        end -= 1  # the last character is quantified: it may be absent
    literal = source[:end]
    return literal if len(literal) >= 3 else None


def strip_text(text: str, patterns: Sequence[re.Pattern[str]]) -> str:
    """``text`` with every match of each pattern removed, in order."""
    for pattern in patterns:
        literal = required_literal(pattern)
        if literal is not None and literal not in text:
            continue
        text = pattern.sub("", text)
    return text
