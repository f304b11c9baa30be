"""Prompts that reuse an earlier prompt's ids tokenize and hash exactly as from scratch."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera.kv.hashing import block_hashes
from infera.kv.tokenizer import PromptRenderer

PIECES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</tool_call>", "<", ">", "<|", "|>",
          "\u0338", "e\u0301", "é", "Zürich", "😀", "毕老师", "\n", "\n\n", " ", "  ", "word", "Words.", "123", "\t"]
TOOLS = [
    [{"type": "function", "function": {"name": "get_weather", "description": "Weather, in °C",
                                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    [{"type": "function", "function": {"name": "lookup", "description": "<|im_end|> ≯ 😀",
                                       "parameters": {"type": "object", "properties": {}}}}],
]
CONTENT = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=12)), max_size=12).map("".join)
ROLE = st.sampled_from(["user", "assistant", "user", "tool", "system"])


@pytest.fixture(scope="module", params=["qwen-tiktoken", "qwen-hf", "tiny"])
def renderer(request: pytest.FixtureRequest, qwen_tokenizer_dir: Path,
              tiny_tokenizer_dir: Path) -> PromptRenderer:
    path = tiny_tokenizer_dir if request.param == "tiny" else qwen_tokenizer_dir
    cached = PromptRenderer.from_dir(path, fast=request.param != "qwen-hf")
    assert cached.uses_tiktoken == (request.param == "qwen-tiktoken")
    assert cached.prompt_cache is not None
    cached.prompt_cache.min_chars = 0  # exercise the cache on short prompts too
    cached.prompt_cache.max_bytes = 200_000  # and its eviction
    return cached


def _check(renderer: PromptRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
    try:
        text = renderer.render_chat(messages, tools)
    except ValueError:
        return  # the template rejects this conversation: nothing to tokenize
    want = renderer.encode(text, add_special_tokens=False)  # from scratch, no prompt cache
    got = renderer.chat_token_ids(messages, tools)
    assert list(got) == want
    for size in (4, 16):
        assert block_hashes(got, size) == block_hashes(want, size)
        assert block_hashes(got, size) == block_hashes(want, size)  # second call: from the stored hashes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    system=st.one_of(st.none(), CONTENT),
    turns=st.lists(st.tuples(ROLE, CONTENT), min_size=1, max_size=8),
    other=st.lists(st.tuples(ROLE, CONTENT), min_size=1, max_size=4),
    tools=st.sampled_from([None, *TOOLS]),
    edit=st.tuples(st.integers(0, 7), CONTENT),
)
def test_incremental_ids_equal_from_scratch(
    renderer: PromptRenderer,
    system: str | None,
    turns: list[tuple[str, str]],
    other: list[tuple[str, str]],
    tools: list[dict[str, Any]] | None,
    edit: tuple[int, str],
) -> None:
    head = [{"role": "system", "content": system}] if system is not None else []
    messages = head + [{"role": r, "content": c} for r, c in turns]
    for k in range(1, len(messages) + 1):  # a conversation growing turn by turn
        _check(renderer, messages[:k], tools)
    edited = [dict(m) for m in messages]  # an earlier turn edited: the old prefix must not leak
    edited[edit[0] % len(edited)]["content"] = edit[1]
    _check(renderer, edited, tools)
    # another session behind the same system prompt and tools
    _check(renderer, head + [{"role": r, "content": c} for r, c in other], tools)
    _check(renderer, messages, None if tools else TOOLS[0])


def _conversation(turns: int) -> list[dict[str, str]]:
    rng = random.Random(4)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    out = [{"role": "system", "content": " ".join(rng.choice(words) for _ in range(400))}]
    for t in range(turns):
        out.append({"role": "user", "content": f"turn {t} " + " ".join(rng.choice(words) for _ in range(80))})
        out.append({"role": "assistant", "content": " ".join(rng.choice(words) for _ in range(80))})
    return out


def test_a_growing_conversation_encodes_only_its_new_turns(qwen_tokenizer_dir: Path) -> None:
    renderer = PromptRenderer.from_dir(qwen_tokenizer_dir)
    cache = renderer.prompt_cache
    assert cache is not None
    cache.min_chars = 0
    conversation = _conversation(10)
    for k in range(2, len(conversation) + 1, 2):
        ids = renderer.chat_token_ids(conversation[:k])
        block_hashes(ids, 16)
    assert cache.hits == len(range(2, len(conversation) + 1, 2)) - 1
    assert cache.reused_tokens > 3 * cache.encoded_tokens  # most tokens came from earlier turns
    assert cache.entries == 1  # each turn's prompt replaced the one it extended


def test_memory_stays_within_the_bound(tiny_tokenizer_dir: Path) -> None:
    renderer = PromptRenderer.from_dir(tiny_tokenizer_dir)
    cache = renderer.prompt_cache
    assert cache is not None
    cache.max_bytes = 300_000
    cache.min_chars = 0
    for i in range(60):
        messages = [{"role": "system", "content": f"session {i} " + "x y z " * 400}, {"role": "user", "content": "hi"}]
        assert renderer.chat_token_ids(messages) == renderer.encode(renderer.render_chat(messages))
    assert 0 < cache.size_bytes <= 300_000
    assert cache.entries < 60


def test_evicted_prompts_are_freed_without_the_cyclic_gc(tiny_tokenizer_dir: Path) -> None:
    """An evicted entry's ids go when it does (reference counting), not at the cyclic GC's next older-generation
    collection: those collections re-scanned every evicted prompt's ids (bench/README.md, sixth round)."""
    import gc

    renderer = PromptRenderer.from_dir(tiny_tokenizer_dir)
    cache = renderer.prompt_cache
    assert cache is not None
    cache.max_bytes = 100_000
    cache.min_chars = 0
    gc.collect()
    gc.disable()
    try:
        for i in range(40):  # unrelated prompts (nothing supersedes another): each new one evicts an old one
            messages = [{"role": "system", "content": f"session {i} " + "x y z " * 300},
                        {"role": "user", "content": "hi"}]
            renderer.chat_token_ids(messages)
        assert cache.entries < 40
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_combining_mark_after_a_special_token_is_not_cut_there(qwen_tokenizer_dir: Path) -> None:
    # NFC composes ">" + U+0338 into one character, so "<|im_start|>" is no longer a token there
    renderer = PromptRenderer.from_dir(qwen_tokenizer_dir)
    assert renderer.prompt_cache is not None
    renderer.prompt_cache.min_chars = 0
    first = [{"role": "user", "content": "hello " * 300}]
    renderer.chat_token_ids(first)
    text = renderer.render_chat(first, add_generation_prompt=False) + "<|im_start|>\u0338 more"
    cache_ids = renderer.prompt_cache.encode(text)
    assert list(cache_ids) == renderer.encode(text)


def test_edited_ids_are_hashed_from_scratch(tiny_tokenizer_dir: Path) -> None:
    renderer = PromptRenderer.from_dir(tiny_tokenizer_dir)
    assert renderer.prompt_cache is not None
    renderer.prompt_cache.min_chars = 0
    messages = _conversation(3)
    renderer.chat_token_ids(messages[:2])
    ids = renderer.chat_token_ids(messages)
    block_hashes(renderer.chat_token_ids(messages[:2]), 4)
    ids = renderer.chat_token_ids(messages)
    ids[0] = ids[0] + 1  # a caller that edits the list in place gets hashes of what it holds
    assert block_hashes(ids, 4) == block_hashes(list(ids), 4)


def test_a_prompt_like_a_stored_one_only_near_its_end_reuses_nothing_past_where_they_differ(
        qwen_tokenizer_dir: Path) -> None:
    """The next turn's lookup keys a stored prompt's last cut by its offset and the bytes just before it: a
    prompt equal there but not earlier must be told apart by the full comparison, not take the other's ids."""
    renderer = PromptRenderer.from_dir(qwen_tokenizer_dir)
    cache = renderer.prompt_cache
    assert cache is not None
    tail = "<|im_end|>\n<|im_start|>user\nthe same last words, long enough to fill the window: 0123456789<|im_end|>\n"
    first = "<|im_start|>system\n" + "alpha " * 1500 + tail + "<|im_start|>"
    other = "<|im_start|>system\n" + "gamma " * 1500 + tail + "<|im_start|>"  # same length, same tail
    assert len(first) == len(other) and first[-100:] == other[-100:]
    assert list(cache.encode(first)) == renderer.encode(first, add_special_tokens=False)
    nxt = other + "assistant\nsomething new<|im_end|>\n"
    reused = cache.reused_tokens
    assert list(cache.encode(nxt)) == renderer.encode(nxt, add_special_tokens=False)
    assert cache.reused_tokens - reused <= 3  # at most "<|im_start|>system\n", the prefix both share


def test_a_branch_off_an_earlier_turn_reuses_the_cuts_its_conversation_registered(qwen_tokenizer_dir: Path) -> None:
    """Each turn's cuts are keyed from the previous turn's hash state (its prefix is not hashed again): those
    keys must be the whole-prefix hashes, or another session sharing the first turns would find nothing."""
    renderer = PromptRenderer.from_dir(qwen_tokenizer_dir)
    cache = renderer.prompt_cache
    assert cache is not None
    cache.min_chars = 0
    conversation = _conversation(8)
    for k in range(2, len(conversation) + 1, 2):
        renderer.chat_token_ids(conversation[:k])
    assert cache.entries == 1
    branch = [*conversation[:7], {"role": "user", "content": "a different question"}]
    hits, reused = cache.hits, cache.reused_tokens
    ids = renderer.chat_token_ids(branch)
    assert list(ids) == renderer.encode(renderer.render_chat(branch), add_special_tokens=False)
    assert cache.hits == hits + 1
    assert cache.reused_tokens - reused > 0.8 * len(ids)
    # the branch's own cuts (keyed from scratch past where it left the conversation) are found by a third
    # session that shares it and then differs
    grown = [*branch, {"role": "assistant", "content": "an answer " * 30}]
    renderer.chat_token_ids([*grown, {"role": "user", "content": "one more"}])
    third = [*grown, {"role": "user", "content": "another one"}]
    reused = cache.reused_tokens
    ids = renderer.chat_token_ids(third)
    assert list(ids) == renderer.encode(renderer.render_chat(third), add_special_tokens=False)
    assert len(ids) - (cache.reused_tokens - reused) < 20
    # a session that shares the branch and then adds more turns than the lookup probes from the end: found
    # by the whole-prefix keys alone, which the branch's entry computed past where it left the conversation
    fourth = [*grown, *({"role": role, "content": f"new {i}"} for i in range(6) for role in ("user", "assistant")),
              {"role": "user", "content": "last"}]
    reused = cache.reused_tokens
    ids = renderer.chat_token_ids(fourth)
    assert list(ids) == renderer.encode(renderer.render_chat(fourth), add_special_tokens=False)
    shared = renderer.encode(renderer.render_chat(grown), add_special_tokens=False)
    assert cache.reused_tokens - reused >= len(shared) - 5
