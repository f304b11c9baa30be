"""The tiktoken codec's segment cache never changes a token id."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.tokenizer import PromptRenderer

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]
_renderers: dict[str, tuple[PromptRenderer, PromptRenderer]] = {}


def renderers(qwen_dir: Path) -> tuple[PromptRenderer, PromptRenderer]:
    if "qwen" not in _renderers:
        _renderers["qwen"] = (PromptRenderer.from_dir(qwen_dir), PromptRenderer.from_dir(qwen_dir, fast=False))
    return _renderers["qwen"]


def test_cached_segments_give_the_same_ids_as_tokenizers(qwen_tokenizer_dir: Path) -> None:
    fast, slow = renderers(qwen_tokenizer_dir)
    assert fast.uses_tiktoken
    rng = random.Random(5)
    words = ["alpha", " beta", "γάμμα", "数据", "\n\n", "  ", "1234", "x = f(y)", "é", "🙂"]
    system = "".join(rng.choice(words) for _ in range(400))
    for turn in range(5):
        text = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
                + "".join(rng.choice(words) for _ in range(60 * turn)) + "<|im_end|>\n<|im_start|>assistant\n")
        for _ in range(2):  # the second pass reads the cache
            assert fast.encode(text) == slow.encode(text)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SPECIALS), st.text(min_size=0, max_size=300)), max_size=12))
def test_any_mix_of_text_and_specials(qwen_tokenizer_dir: Path, parts: list[str]) -> None:
    fast, slow = renderers(qwen_tokenizer_dir)
    text = "".join(parts)
    assert fast.encode(text) == slow.encode(text)


def test_long_text_goes_through_the_gil_free_path_with_the_same_ids(qwen_tokenizer_dir: Path) -> None:
    from tokenizers import Tokenizer

    from infera.kv.codecs import GIL_FREE_CHARS

    tok = Tokenizer.from_file(str(qwen_tokenizer_dir / "tokenizer.json"))
    _, slow = renderers(qwen_tokenizer_dir)
    rng = random.Random(9)
    words = ["alpha", " beta", "γάμμα", "数据", "\n\n", "  ", "1234", "<|im_end|>", "🙂", "y" * 300]
    text = "".join(rng.choice(words) for _ in range(GIL_FREE_CHARS // 10))
    assert len(text) > GIL_FREE_CHARS
    for special in (False, True):
        assert slow.encode(text, add_special_tokens=special) == tok.encode(text, add_special_tokens=special).ids


def test_the_segment_cache_keeps_its_newest_segments_within_its_bound(qwen_tokenizer_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from infera.kv import codecs

    monkeypatch.setattr(codecs, "SEGMENT_CACHE_ENTRIES", 8)
    fast, slow = PromptRenderer.from_dir(qwen_tokenizer_dir), renderers(qwen_tokenizer_dir)[1]
    segments = fast._codec._segments  # type: ignore[attr-defined]
    texts = [f"<|im_start|>user\nturn {i} " + "many words here " * 10 + "<|im_end|>" for i in range(20)]
    for text in texts:
        assert fast.encode(text) == slow.encode(text)
        assert len(segments) <= 8
    assert [s[len("user\nturn "):].split()[0] for s in segments] == [str(i) for i in range(12, 20)]
    assert fast.encode(texts[-1]) == slow.encode(texts[-1])  # read back from the cache


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SPECIALS), st.text(min_size=0, max_size=300)), max_size=12))
def test_encode_fresh_gives_the_same_ids_without_touching_the_segment_cache(qwen_tokenizer_dir: Path,
                                                                           parts: list[str]) -> None:
    fast, slow = renderers(qwen_tokenizer_dir)
    codec = fast._codec  # type: ignore[attr-defined]
    text = "".join(parts)
    before = list(codec._segments.items())
    assert codec.encode_fresh(text) == slow.encode(text)
    assert list(codec._segments.items()) == before


def test_the_prompt_caches_fresh_tail_skips_the_segment_cache(qwen_tokenizer_dir: Path) -> None:
    """A chat's next turn past a reused prefix is new text: its segment is not kept (nor evicts a kept one)."""
    fast, slow = PromptRenderer.from_dir(qwen_tokenizer_dir), renderers(qwen_tokenizer_dir)[1]
    segments = fast._codec._segments  # type: ignore[attr-defined]
    system = "<|im_start|>system\n" + "a long shared system prompt, " * 300 + "<|im_end|>\n"
    for i in range(3):
        text = system + f"<|im_start|>user\nturn {i} " + "many words here " * 20 + "<|im_end|>\n<|im_start|>assistant\n"
        assert fast.encode_chat(text) == slow.encode(text)
    assert fast.prompt_cache is not None and fast.prompt_cache.hits == 2
    assert not any(s.startswith("user\nturn 1") or s.startswith("user\nturn 2") for s in segments)


_NEAR = st.sampled_from([*SPECIALS, "<", ">", "<|", "|>", "<|im_", "<|im_end", "im_end|>", "<<|im_end|>", "<|x|>",
                         "</tool_call", "a", " ", "\n", "é", "数"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_NEAR, st.text(max_size=20)), max_size=16))
def test_the_delimited_split_cuts_where_the_regex_does(qwen_tokenizer_dir: Path, parts: list[str]) -> None:
    """The str.find split of ChatML-like specials == ``re.split`` on them all, near-specials and nesting included."""
    import re

    fast, _ = renderers(qwen_tokenizer_dir)
    codec = fast._codec
    assert codec._split == codec._split_delimited  # type: ignore[union-attr]  # Qwen's specials are all <...>
    names = sorted(codec._special_ids, key=len, reverse=True)  # type: ignore[union-attr]
    regex = re.compile("(" + "|".join(map(re.escape, names)) + ")")
    text = "".join(parts)
    assert codec._split_delimited(text) == regex.split(text)  # type: ignore[union-attr]
