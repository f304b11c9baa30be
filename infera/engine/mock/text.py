"""Deterministic output: what the mock "generates" for a request, decided at admission.

The output is seeded by the prompt's token ids (and ``--seed``), so the same prompt always
gives the same answer on every mock. It is made of words whose tokens each decode to a
clean piece of text, so streaming deltas concatenate to the final text exactly. A request
gets exactly ``max_tokens`` tokens unless a stop string ends it (the stop string is cut
from the text, as OpenAI and vLLM do by default).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

_WORDS_TEXT = (
    "the of and to in is that it for on with as was at by be this from or have an they which one you "
    "were all we when there can more if no out so said what up its about into than them only other "
    "time new some could these two may first then do any like my now over such our man me even most "
    "made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three river mountain garden window engine"
)
WORDS = tuple(_WORDS_TEXT.split())


@dataclasses.dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclasses.dataclass(slots=True)
class PlannedOutput:
    """Token ids and their text pieces (``"".join(pieces)`` is the output text)."""

    ids: list[int]
    pieces: list[str]
    finish_reason: str  # "length" | "stop" | "tool_calls"
    stop_reason: str | None = None  # the stop string that ended the text
    tool_call: ToolCall | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class OutputVocab:
    """Words the mock writes, each as token ids whose single-token decodes are clean text."""

    def __init__(self, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]) -> None:
        self.words: list[tuple[list[int], list[str]]] = []
        for word in WORDS:
            text = " " + word
            ids = encode(text)
            pieces = [decode([i]) for i in ids]
            if ids and "".join(pieces) == text and "\ufffd" not in text:
                self.words.append((ids, pieces))
        if not self.words:
            raise ValueError("the tokenizer cannot write any plain ASCII word token by token")

    def rng_for(self, prompt_ids: Sequence[int], seed: int) -> random.Random:
        # hash() of a tuple of ints does not depend on PYTHONHASHSEED: stable across processes.
        return random.Random(hash((seed, len(prompt_ids), tuple(prompt_ids))))

    def plan(self, prompt_ids: Sequence[int], max_tokens: int, stop: Sequence[str], seed: int) -> PlannedOutput:
        rng = self.rng_for(prompt_ids, seed)
        ids: list[int] = []
        pieces: list[str] = []
        words = self.words
        while len(ids) < max_tokens:
            for pick in rng.choices(range(len(words)), k=max_tokens - len(ids)):
                wids, wpieces = words[pick]
                ids.extend(wids)
                pieces.extend(wpieces)
        del ids[max_tokens:], pieces[max_tokens:]
        out = PlannedOutput(ids=ids, pieces=pieces, finish_reason="length")
        if stop:
            _apply_stop(out, stop)
        return out


def _apply_stop(out: PlannedOutput, stop: Sequence[str]) -> None:
    text = out.text
    best: tuple[int, str] | None = None
    for s in stop:
        if not s:
            continue
        pos = text.find(s)
        if pos >= 0 and (best is None or pos + len(s) < best[0] + len(best[1])):
            best = (pos, s)
    if best is None:
        return
    pos, s = best
    end = pos + len(s)
    kept_ids: list[int] = []
    kept_pieces: list[str] = []
    start = 0
    for tok, piece in zip(out.ids, out.pieces, strict=True):
        kept_ids.append(tok)
        kept_pieces.append(piece[:max(0, pos - start)])
        start += len(piece)
        if start >= end:
            break
    out.ids, out.pieces = kept_ids, kept_pieces
    out.finish_reason = "stop"
    out.stop_reason = s


def stop_list(value: Any) -> list[str]:
    """The request's ``stop`` as a list (OpenAI allows a string, a list, or null)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise ValueError("stop must be a string or a list of strings")
