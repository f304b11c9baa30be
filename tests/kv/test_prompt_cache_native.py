"""The prompt cache's bookkeeping in C (``_native.prompt_tail/prompt_cuts/prompt_store/prompt_evict``, and a hit's
rest in one call, ``prompt_extend``, where the codec packs the tail's ids) against its Python lines: two or three
caches, one per path, fed the same prompts, must hand out the same ids and hold the same keys, tail keys, entries
(cuts, ids, hashes) in the same LRU order, bytes and counters after every prompt."""

from __future__ import annotations

import re
from array import array
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera.kv import hashing
from infera.kv.hashing import block_hashes, pure_block_hashes
from infera.kv.native import choose
from infera.kv.prompt_cache import TAIL_WINDOW, PromptCache
from infera.kv.tokenizer import PromptRenderer

try:
    choose(True)
except ImportError:
    pytest.skip("the C extension infera.kv._native is not built", allow_module_level=True)

TOKENS = {"<|im_start|>": 1 << 20, "<|im_end|>": (1 << 20) + 1, "<x>": (1 << 20) + 2}
_SPLIT = re.compile("(" + "|".join(map(re.escape, sorted(TOKENS, key=len, reverse=True))) + ")")


def _codec(text: str) -> list[int]:
    """A codec that splits on its boundary tokens first (as the real ones do): a token's id, else one id a character."""
    out: list[int] = []
    for piece in _SPLIT.split(text):
        out.extend([TOKENS[piece]] if piece in TOKENS else map(ord, piece))
    return out


def _state(cache: PromptCache) -> tuple[Any, ...]:
    def place(p: tuple[list[Any], int]) -> tuple[list[bytes], int]:
        return [e.data for e in p[0]], p[1]

    entries = [(e.data, e.cuts, e.ids.tolist(), e.hashes, e.holder[0] is e, e.state is None, e.first,
                e.branch and e.branch[0])
               for e in cache._lru.values()]
    return ({k: place(v) for k, v in cache._keys.items()}, {k: place(v) for k, v in cache._ends.items()}, entries,
            cache.size_bytes, cache.hits, cache.reused_tokens, cache.encoded_tokens)


def _check_keys(cache: PromptCache) -> None:
    """What a prompt that keys only the cuts it does not share with the prompt it was made from must keep: every key
    leads to a live entry's cut with that key (no key keeps an evicted prompt alive past the bound); the newest
    entry's cuts from its ``first`` on are keyed to it, and each cut before that leads, if anywhere, to a live entry
    with the same bytes before it (the prompt it shares them with); the bytes are the entries' and within the bound."""
    live = {id(e) for e in cache._lru.values()}
    for table, at in ((cache._keys, 1), (cache._ends, 3)):
        for key, (holder, k) in table.items():
            assert holder and id(holder[0]) in live and holder[0].cuts[k][at] == key
    if cache.entries:
        newest = next(reversed(cache._lru.values()))
        assert newest.holder[0] is newest and 0 <= newest.first <= len(newest.cuts)
        for k, cut in enumerate(newest.cuts):
            # its keys are those of its bytes, however they were hashed (resumed from a stored state or not)
            end = cut[0]
            assert cut[1] == xxhash.xxh3_64_intdigest(newest.data[:end])
            assert cut[3] == xxhash.xxh3_64_intdigest(newest.data[max(0, end - TAIL_WINDOW) : end], seed=end)
            for table, at in ((cache._keys, 1), (cache._ends, 3)):
                if k >= newest.first:
                    assert table[cut[at]] == (newest.holder, k)
                elif cut[at] in table:
                    holder, j = table[cut[at]]
                    assert holder[0].cuts[j][0] == cut[0] and holder[0].data[: cut[0]] == newest.data[: cut[0]]
    assert cache.size_bytes == sum(e.size for e in cache._lru.values())
    assert cache.size_bytes <= cache.max_bytes or cache.entries == 1


def _pair(encode: Any, boundaries: dict[str, int], max_bytes: int) -> tuple[PromptCache, PromptCache]:
    caches = PromptCache(encode, boundaries, max_bytes, native=True), PromptCache(encode, boundaries, max_bytes,
                                                                                 native=False)
    for cache in caches:
        cache.min_chars = 0
    return caches


def _trio(encode: Any, boundaries: dict[str, int], max_bytes: int) -> tuple[PromptCache, ...]:
    """:func:`_pair` and a C cache given ``encode``'s ids packed (a hit's rest through ``_native.prompt_extend``)."""
    packed = PromptCache(encode, boundaries, max_bytes, native=True,
                         encode_tail_packed=lambda s: array("I", encode(s)).tobytes())
    packed.min_chars = 0
    return (*_pair(encode, boundaries, max_bytes), packed)


def _feed(caches: tuple[PromptCache, ...], text: str, want: list[int], listed: bool, size: int) -> None:
    got = [cache.encode_within(text, None, listed) for cache in caches]
    for ids in got:
        assert ids is not None and list(ids) == want
        assert not size or block_hashes(ids, size) == block_hashes(want, size)  # size 0: ids past uint32
        # the block hashes made with the ids (every size asked for before) are those of the ids
        for made_size, made in (getattr(ids, "complete", None) or {}).items():
            assert made == pure_block_hashes(want, made_size)
    for cache in caches[1:]:
        assert _state(caches[0]) == _state(cache)
    for cache in caches:
        _check_keys(cache)


PIECE = st.sampled_from([*TOKENS, "<", ">", "<|", "|>", "x", "abc ", "\n", "é", "\u0338", "😀", "<x", "x>", "  "])
TEXT = st.lists(st.one_of(PIECE, st.text(max_size=6)), max_size=10).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.integers(0, 30), st.floats(0, 1), TEXT, st.booleans()), min_size=1, max_size=14),
       max_bytes=st.integers(200, 4000), size=st.sampled_from([1, 3, 4]))
def test_the_c_path_leaves_the_state_the_python_path_leaves(steps: list[tuple[int, float, str, bool]],
                                                            max_bytes: int, size: int) -> None:
    caches = _trio(_codec, {t: i for t, i in TOKENS.items()}, max_bytes)
    seen: list[str] = []
    for pick, where, new, listed in steps:
        # extend (part of) an earlier prompt: its last cut (a growing conversation), an earlier one (a branch), or
        # none of it
        base = seen[pick % len(seen)] if seen and pick < 25 else ""
        text = base[: round(len(base) * where)] if pick % 3 == 0 else base
        text += new
        seen.append(text)
        _feed(caches, text, _codec(text), listed, size)


def test_a_codec_that_does_not_split_where_expected_is_not_remembered_by_either_path() -> None:
    caches = _trio(lambda s: [ord(c) for c in s], {"<x>": 1 << 20}, 1 << 20)  # never emits the token's id
    for text in ("a<x>b", "a<x>b<x>c", "<x>"):
        _feed(caches, text, [ord(c) for c in text], True, 2)
    assert [c.entries for c in caches] == [0, 0, 0]


def test_u32_pack_is_the_arrays_bytes_or_none() -> None:
    native = choose(True)
    for values in ([], [0, 1, 2**32 - 1], [True, 5, 1 << 20]):
        assert native.u32_pack(values) == array("I", values).tobytes()
    for bad in ([-1], [2**32], [1.0], ["a"], [2**70], [3, None]):
        assert native.u32_pack(bad) is None  # the caller's array.extend raises as it did
    assert native.u32_pack((1, 2)) is None


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 2**32 - 1), max_size=40), known=st.lists(st.integers(0, 2**64 - 1), max_size=12),
       size=st.integers(1, 5), most=st.one_of(st.none(), st.integers(0, 12)))
def test_extend_hashes_in_c_equals_its_python_lines(ids: list[int], known: list[int], size: int,
                                                     most: int | None) -> None:
    n_blocks = len(ids) // size
    k = min(len(known), n_blocks, n_blocks if most is None else most)
    want = known[:k] + pure_block_hashes(ids[k * size : n_blocks * size], size, known[k - 1] if k else 0)
    with pytest.MonkeyPatch.context() as mp:
        for impl in (None, choose(True)):
            mp.setattr(hashing, "_native", impl)
            assert hashing.extend_hashes(array("I", ids), known, size, most) == want


def test_ids_past_uint32_reach_the_caller_and_are_not_stored_by_either_path() -> None:
    def wide(text: str) -> list[int]:
        return [1 << 33 if i == ord("w") else i for i in _codec(text)]

    caches = _pair(wide, {t: i for t, i in TOKENS.items()}, 1 << 20)
    for text in ("<|im_start|>a<|im_end|>", "<|im_start|>a<|im_end|>w", "<|im_start|>a<|im_end|>b", "w<x>"):
        _feed(caches, text, wide(text), True, 0)
    assert caches[0].entries == caches[1].entries == 1  # the last prompt without "w" replaced the first


@pytest.mark.parametrize("listed", [True, False])
def test_chat_sessions_through_both_paths(qwen_tokenizer_dir: Path, listed: bool) -> None:
    """The Qwen codec on chat prompts: sessions behind shared system prompts, growing and branching, under a bound
    that evicts."""
    renderer = PromptRenderer.from_dir(qwen_tokenizer_dir)
    codec = renderer._codec
    caches = _trio(lambda s: codec.encode(s, False), codec.boundaries, 60_000)
    sessions: list[list[dict[str, str]]] = []
    for i in range(60):
        group = i % 4
        if i % 5 == 4 and sessions:  # a branch off an earlier session's turn
            messages = [*sessions[i % len(sessions)][:3], {"role": "user", "content": f"branch {i} é\u0338"}]
        elif i % 3 == 1 and sessions:  # the next turn of the last session
            messages = [*sessions[-1], {"role": "assistant", "content": f"answer {i} " * 20},
                        {"role": "user", "content": f"more {i}"}]
        else:
            messages = [{"role": "system", "content": f"tenant {group} rules " * 200},
                        {"role": "user", "content": f"question {i} 😀 " * 10}]
        sessions.append(messages)
        text = renderer.render_chat(messages)
        _feed(caches, text, codec.encode(text, False), listed, 16)
    assert caches[0].hits > 20


TURN = st.lists(st.one_of(st.sampled_from(["abc ", "\n", "é", "\u0338", "😀", "<", ">", "<x>", "  ", "x"]),
                          st.text(max_size=8)), max_size=8).map("".join)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.lists(st.tuples(st.integers(0, 9), TURN, TURN, st.one_of(st.none(), st.integers(0, 60))),
                      min_size=1, max_size=16),
       max_bytes=st.integers(300, 6000), sizes=st.lists(st.sampled_from([1, 2, 4, 16]), min_size=1, max_size=3))
def test_a_conversations_turns_extended_equal_their_ids_and_hashes_from_scratch(
        turns: list[tuple[int, str, str, int | None]], max_bytes: int, sizes: list[int]) -> None:
    """Random ChatML conversations (a shared system prompt, turns appended to one of the earlier conversations: the
    next turn, a branch, a fresh one), each prompt given to the packed C cache as the router's context asks it
    (``listed`` False, perhaps under a ``most`` bound): the ids and every block size's hashes it hands out equal those
    made from scratch, and it decides the bound and leaves its tables as the pure-Python cache does."""
    calls: list[str] = []

    def call(text: str, first: str, last: str, specials: dict[str, int]) -> bytes:
        assert text.isascii() and (first, last, specials) == ("<", ">", TOKENS)  # only an ASCII tail comes here
        calls.append(text)
        return array("I", _codec(text)).tobytes()

    # the C path with a packer (_trio's third), and with the packer and the C call an ASCII tail goes to
    caches = (*_trio(_codec, {t: i for t, i in TOKENS.items()}, max_bytes),
              PromptCache(_codec, dict(TOKENS), max_bytes, native=True, encode_tail_call=(call, "<", ">", TOKENS),
                          encode_tail_packed=lambda s: array("I", _codec(s)).tobytes()))
    caches[3].min_chars = 0
    pure, packed = caches[1], caches[2]
    system = "<|im_start|>system\nbe brief<|im_end|>\n"
    chats: list[str] = []
    for pick, user, answer, most in turns:
        if chats and pick < 7:  # the next turn of an earlier conversation (the last one most often)
            i = len(chats) - 1 if pick < 4 else pick % len(chats)
            prior = chats[i]
        else:
            i, prior = len(chats), system
            chats.append(prior)
        head = prior.removesuffix("<|im_start|>assistant\n")
        if prior != system:
            head += f"<|im_start|>assistant\n{answer}<|im_end|>\n"
        text = f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        chats[i] = text
        want = _codec(text)
        got = [cache.encode_within(text, most, False) for cache in caches]
        assert (got[1] is None) == (got[2] is None) == (got[0] is None) == (got[3] is None)
        if got[2] is None:
            continue
        for ids in got:
            assert ids is not None and list(ids) == want
            for size in sizes:  # a size asked for: made with the ids from the next prompt on
                assert block_hashes(ids, size) == pure_block_hashes(want, size)
            for made_size, made in (getattr(ids, "complete", None) or {}).items():
                assert made == pure_block_hashes(want, made_size)
        assert _state(packed) == _state(pure) == _state(caches[0]) == _state(caches[3])
        _check_keys(packed)


def test_an_ascii_tail_goes_to_the_c_call_and_any_other_to_the_packer() -> None:
    went: list[tuple[str, str]] = []

    def call(text: str, first: str, last: str, specials: dict[str, int]) -> bytes:
        went.append(("call", text))
        return array("I", _codec(text)).tobytes()

    def packer(text: str) -> bytes:
        went.append(("packer", text))
        return array("I", _codec(text)).tobytes()

    cache = PromptCache(_codec, dict(TOKENS), 1 << 20, native=True, encode_tail_packed=packer,
                        encode_tail_call=(call, "<", ">", TOKENS))
    cache.min_chars = 0
    first = "<|im_start|>user\nhi<|im_end|>\n"
    for text in (first, first + "<|im_start|>user\nho<|im_end|>\n", first + "<|im_start|>user\nhé<|im_end|>\n"):
        assert list(cache.encode_within(text, None, False) or []) == _codec(text)
    # the tails past the longest cut seen (after the first's <|im_end|>, then after the second's <|im_start|>)
    assert went == [("call", "\n<|im_start|>user\nho<|im_end|>\n"), ("packer", "user\nhé<|im_end|>\n")]
