"""Prompts that reuse an earlier prompt's ids tokenize and hash exactly as from scratch."""

from __future__ import annotations

import gc
import random
import struct
from array import array
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera.kv import hashing
from infera.kv.hashing import ArrayIds, PromptIds, block_hashes, pure_block_hashes
from infera.kv.native import choose
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
def renderer(request: pytest.FixtureRequest, qwen_tokenizer_dir: Path, tiny_tokenizer_dir: Path,
             index_path: str) -> PromptRenderer:
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
    # half the prompts as the router's context takes them (the cache's array, no list), half as a list: each
    # extends prompts the other kind stored
    arrays = len(text) % 2 == 1
    got: Sequence[int] = renderer.encode_chat_ids(text) if arrays else renderer.chat_token_ids(messages, tools)
    assert list(got) == want and got == want
    assert type(got) is not PromptIds or got.origin is None or got.origin.tolist() == want
    if type(got) is ArrayIds:
        assert got.array.tolist() == want and got[1:5] == want[1:5] and (not want or got[-1] == want[-1])
    for size, made in (got.complete or {}).items() if type(got) in (PromptIds, ArrayIds) else ():
        assert made == block_hashes(want, size)  # made with the ids, handed to the router's context as they are
    for size in (4, 16, 5 if arrays else 6):
        assert block_hashes(got, size) == block_hashes(want, size)
        assert block_hashes(got, size) == block_hashes(want, size)  # second call: from the stored hashes
        assert block_hashes(got, size, parent=7) == block_hashes(want, size, parent=7)


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


def test_stored_ids_are_out_of_the_cyclic_gcs_sight(qwen_tokenizer_dir: Path) -> None:
    """A stored prompt's ids are one uint32 array, not a list of ints that every young collection walks (it did: ~10
    µs a request at 1k tokens, bench/README.md, seventh round); the caller still gets a list of its own."""
    renderer = PromptRenderer.from_dir(qwen_tokenizer_dir)
    cache = renderer.prompt_cache
    assert cache is not None
    cache.min_chars = 0
    conversation = _conversation(6)
    for k in range(2, len(conversation) + 1, 2):
        ids = renderer.chat_token_ids(conversation[:k])
        block_hashes(ids, 16)
    assert type(ids) is PromptIds and len(ids) > 1000
    n, head = len(ids), tuple(ids[:8])
    del ids
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is list and len(o) >= n and tuple(o[:8]) == head]
    again = renderer.chat_token_ids(conversation)  # a full hit: the ids come from the array
    assert type(again) is PromptIds and list(again) == renderer.encode(renderer.render_chat(conversation))
    again.append(1)  # the caller's own list
    assert list(renderer.chat_token_ids(conversation)) == list(again[:-1])


@pytest.mark.parametrize("edit", ["bool", "float", "negative", "wide", "subclass", "shorter", "longer", "same"])
def test_an_edited_list_is_told_apart_from_its_origin(edit: str) -> None:
    """``block_hashes`` trusts the known hashes only while the list equals its uint32 origin (C and Python agree)."""

    class Int(int):
        pass

    base = [5, 300, 70_000, 151_643, 2**32 - 1] * 8
    ids = PromptIds(base)
    ids.origin = array("I", base)
    ids.known_hashes = {4: [1, 2, 3]}  # wrong on purpose: used only while ids == origin
    want_same = {"bool": False, "float": True, "negative": False, "wide": False, "subclass": True, "shorter": False,
                 "longer": False, "same": True}[edit]
    if edit == "bool":
        ids[0] = True  # 1 != 5
    elif edit == "float":
        ids[1] = 300.0  # type: ignore[call-overload]  # equal in a list compare
    elif edit == "negative":
        ids[2] = -1
    elif edit == "wide":
        ids[3] = 2**32 + 151_643
    elif edit == "subclass":
        ids[4] = Int(2**32 - 1)
    elif edit == "shorter":
        ids.pop()
    elif edit == "longer":
        ids.append(1)
    native = _built()
    for impl in [None] + ([native] if native is not None else []):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(hashing, "_native", impl)
            if edit in ("negative", "wide"):  # not a uint32: what hashing any such list raises
                with pytest.raises(struct.error):
                    block_hashes(ids, 4)
                continue
            got = block_hashes(ids, 4)
        if want_same:
            assert got[:3] == [1, 2, 3]
        else:
            assert got == pure_block_hashes([int(t) for t in ids], 4)


def _built() -> ModuleType | None:
    """The C extension whatever ``INFERA_PURE_PYTHON`` says, or None when it is not built."""
    try:
        return choose(True)
    except ImportError:
        return None


def test_the_c_helpers_equal_their_python_lines() -> None:
    native = _built()
    if native is None:
        pytest.skip("the C extension infera.kv._native is not built")
    rng = random.Random(3)
    table = tuple(range(1000))
    for _ in range(200):
        values = [rng.choice([rng.randrange(1000), rng.randrange(2**32)]) for _ in range(rng.randrange(0, 70))]
        ids = array("I", values)
        out = PromptIds()
        native.u32_fill(out, ids, table)
        assert out == values and type(out) is PromptIds
        assert native.u32_equal(out, ids, table) is True
        assert native.u32_equal(list(values), ids, ()) is True  # not the table's objects: compared by value
        if values:
            changed = list(out)
            changed[-1] = (changed[-1] + 1) % 2**32
            assert native.u32_equal(changed, ids, table) is False
        for size in (1, 4, 16):
            for first in range(0, len(values) // size + 2, 3):
                got = native.chain_hashes_u32(ids, first, len(values) // size, size, 7)
                assert got == native.chain_hashes(values, first, len(values) // size, size, 7)
                if first == 0:
                    assert got == pure_block_hashes(values, size, 7)
    with pytest.raises(ValueError, match="empty"):
        native.u32_fill([1], array("I", [2]), table)  # fills only an empty list
    with pytest.raises(TypeError):
        native.u32_equal([1], array("Q", [1]), table)  # uint32 only


def test_the_routing_context_takes_the_caches_block_hashes_and_they_are_exact(qwen_tokenizer_dir: Path) -> None:
    """The context of a prompt the cache extended carries the hashes the cache made from its ids (no list compare,
    no second pass): equal to hashing the plain ids, turn after turn, and for a second session and an edited one."""
    from infera.router.context import ContextBuilder, RouteRequest

    renderer = PromptRenderer.from_dir(qwen_tokenizer_dir)
    cache = renderer.prompt_cache
    assert cache is not None
    cache.min_chars = 0
    builder = ContextBuilder(renderer, tokenize=True)
    conversation = _conversation(6)
    other = [conversation[0], {"role": "user", "content": "another session"}]
    edited = [dict(m) for m in conversation]
    edited[3]["content"] = "edited"
    prompts = [conversation[:k] for k in range(2, len(conversation) + 1, 2)] + [other, edited, conversation]
    prefilled = 0
    for messages in prompts:
        req = RouteRequest(kind="chat", path="/v1/chat/completions", body=b"{}", payload={"messages": messages},
                           model="m")
        ctx = builder.build(req)
        plain = renderer.encode(renderer.render_chat(messages))
        assert ctx.token_ids is not None and list(ctx.token_ids) == plain
        ids = ctx.token_ids
        assert type(ids) is ArrayIds  # the cache's array, no list built
        prefilled += bool(ids.complete) and 16 in ids.complete
        for size in (16, 4):
            assert ctx.hashes(size) == pure_block_hashes(plain, size)
    assert prefilled >= len(prompts) - 2  # all but the first prompt (and the first with size 4 seen): made at once


def test_array_ids_read_and_compare_as_the_list_of_their_ids() -> None:
    ids = ArrayIds(array("I", [5, 0, 4294967295, 7]))
    same = [5, 0, 4294967295, 7]
    assert len(ids) == 4 and list(ids) == same and ids.tolist() == same
    assert ids[0] == 5 and ids[-1] == 7 and ids[1:3] == [0, 4294967295] and ids[::-1] == same[::-1]
    assert ids == same and ids == tuple(same) and ids == ArrayIds(array("I", same)) and ids == array("I", same)
    assert ids != [5, 0, 4294967295] and ids != [5, 0, 4294967295, 8] and ids != "abcd" and ids != [5.5, 0, 1, 7]
    assert (ids == [5.0, 0, 4294967295, 7]) == (same == [5.0, 0, 4294967295, 7])  # as a list compares
    with pytest.raises(IndexError):
        ids[4]
    with pytest.raises(TypeError):
        hash(ids)
    assert block_hashes(ids, 2) == pure_block_hashes(same, 2)
    assert block_hashes(ids, 3, 9) == pure_block_hashes(same, 3, 9)
    assert not ArrayIds(array("I")) and block_hashes(ArrayIds(array("I")), 4) == []


def test_a_block_size_first_asked_of_array_ids_is_kept_for_the_next_turn(qwen_tokenizer_dir: Path) -> None:
    renderer = PromptRenderer.from_dir(qwen_tokenizer_dir)
    cache = renderer.prompt_cache
    assert cache is not None
    cache.min_chars = 0
    conversation = _conversation(4)
    first = renderer.encode_chat_ids(renderer.render_chat(conversation[:2]))
    assert type(first) is ArrayIds and 8 not in (first.complete or {})
    block_hashes(first, 8)  # the router asks for a block size the cache has not seen
    second = renderer.encode_chat_ids(renderer.render_chat(conversation))
    assert type(second) is ArrayIds and second.complete is not None
    assert second.complete[8] == pure_block_hashes(renderer.encode(renderer.render_chat(conversation)), 8)


# routing_quality's shapes (bench/workloads.py): long system prompts shared by many requests (tenants: one unique
# question each), and sessions whose next request appends the previous answer and a new question (multiturn);
# their contents with unicode, combining marks (NFC), specials' text and near-specials
WORKLOAD_WORDS = ["policy", "refund", " tenant", "Request", "Z\u00fcrich", "\U0001f600", "\u6bd5\u8001\u5e08",
                  "e\u0301", "A\u030a", "\u0338", "<|im_end|>", "<|im_start|>", "<|im_end", "<<|im_end|>", "<think>",
                  "\n", "\n\n", "1234", "don't", "  ", "\t", "?!", "https://x.example/a?b=1"]
PARAGRAPH = st.lists(st.one_of(st.sampled_from(WORKLOAD_WORDS), st.text(max_size=6)), min_size=1, max_size=50).map(
    " ".join)


@pytest.fixture(scope="module")
def workload_renderers(index_path: str, qwen_tokenizer_dir: Path) -> tuple[PromptRenderer, PromptRenderer]:
    """(the router's renderer: recipes, prompt cache (its tail packed in C where built), a tight memory bound;
    a reference that renders every prompt whole with jinja and encodes it with ``tokenizers``, nothing cached)."""
    cached = PromptRenderer.from_dir(qwen_tokenizer_dir)
    assert cached.prompt_cache is not None and cached.uses_tiktoken
    cached.prompt_cache.min_chars = 0
    cached.prompt_cache.max_bytes = 120_000
    scratch = PromptRenderer.from_dir(qwen_tokenizer_dir, fast=False)
    scratch._plain = dict.fromkeys(scratch._plain)  # type: ignore[assignment]  # no recipe, no render cache:
    scratch._renders = dict.fromkeys(scratch._renders)  # type: ignore[assignment]  # jinja renders it whole
    return cached, scratch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    systems=st.lists(PARAGRAPH, min_size=1, max_size=3),
    sessions=st.lists(st.tuples(st.integers(0, 2), st.lists(st.tuples(PARAGRAPH, PARAGRAPH), min_size=1, max_size=4)),
                      min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_workload_shaped_requests_take_the_ids_of_a_render_and_encode_from_scratch(
    workload_renderers: tuple[PromptRenderer, PromptRenderer],
    systems: list[str],
    sessions: list[tuple[int, list[tuple[str, str]]]],
    seed: int,
) -> None:
    cached, scratch = workload_renderers
    queues = []
    for which, turns in sessions:  # each session's requests in order: [system, q1], [system, q1, a1, q2], ...
        history = [{"role": "system", "content": systems[which % len(systems)]}]
        requests = []
        for question, answer in turns:
            history = [*history, {"role": "user", "content": question}]
            requests.append(history)
            history = [*history, {"role": "assistant", "content": answer}]
        queues.append(requests)
    rng = random.Random(seed)
    played: list[list[dict[str, str]]] = []
    while any(queues):  # the sessions interleaved, as concurrent sessions arrive
        q = rng.choice([q for q in queues if q])
        played.append(q.pop(0))
    played += rng.sample(played, min(3, len(played)))  # some sent again (routing_quality's second variant)
    for messages in played:
        text = cached.render_chat(messages)
        want = scratch.encode(scratch.render_chat(messages))
        assert text == scratch.render_chat(messages)
        got = cached.encode_chat_ids(text)
        assert list(got) == want
        for size, made in (got.complete or {}).items() if type(got) in (PromptIds, ArrayIds) else ():
            assert made == block_hashes(want, size)
        assert block_hashes(got, 16) == block_hashes(want, 16)
