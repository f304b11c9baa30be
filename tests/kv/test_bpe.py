"""The C encoder of ASCII text (``infera.kv._bpe``) against tiktoken's ``encode_ordinary``, its reference: the same
ids for both patterns it knows, on random text built from every ASCII class the patterns tell apart, on random
unicode (which goes to tiktoken whole), on pieces long enough to merge off the stack and text long enough to run
without the GIL; and the codec really uses it where it is built."""

from __future__ import annotations

import json
import shutil
import string
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv import bpe
from infera.kv.codecs import TiktokenSpec, tiktoken_spec
from infera.kv.native import ENV

tiktoken = pytest.importorskip("tiktoken")
try:
    from infera.kv import _bpe
except ImportError:
    _bpe = None  # type: ignore[assignment]
needs_c = pytest.mark.skipif(_bpe is None, reason="the C extension infera.kv._bpe is not built")

QWEN, CL100K = (p for p, _ in sorted(bpe.PATTERN_DIGITS.items(), key=lambda kv: kv[1]))

# Fragments covering what the pattern tells apart: letters, digits (runs longer than 3), each punctuation mark,
# each ASCII whitespace (\v and \f are \s; 0x1c-0x1f and 0x7f are not), CR/LF runs, contractions in both cases
# and apostrophes that start none.
FRAGMENTS = [
    *"aZ09", "hello", "World", "the", " the", "ing", "Qwen", "xqzj", "1234567", "12",
    *string.punctuation, "...", "--", "==>", "://",
    " ", "  ", "\t", "\r", "\n", "\r\n", "\n\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x00", "\x7f", " \n ",
    "'s", "'S", "'t", "'T", "'re", "'RE", "'rE", "'ve", "'Ve", "'m", "'M", "'ll", "'Ll", "'d", "'D", "'x", "'",
    "'r", "'l", "'v",
]


@pytest.fixture(scope="module")
def spec(qwen_tokenizer_dir: Path) -> TiktokenSpec:
    found = tiktoken_spec(json.loads((qwen_tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8")))
    assert found is not None and found.pattern == QWEN
    return found


Pair = tuple[Callable[[str], list[int]], Any]
_pairs: dict[str, Pair] = {}


def pair(spec: TiktokenSpec, pattern: str) -> Pair:
    """(tiktoken's encode_ordinary, the C encoder) for ``pattern`` over Qwen's ranks."""
    if pattern not in _pairs:
        ref = tiktoken.Encoding("ref", pat_str=pattern, mergeable_ranks=spec.ranks, special_tokens={})
        _pairs[pattern] = (ref.encode_ordinary, _bpe.Bpe(spec.ranks, bpe.PATTERN_DIGITS[pattern], ref.encode_ordinary))
    return _pairs[pattern]


def ascii_texts() -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join),
        st.text(alphabet=st.characters(max_codepoint=127), max_size=60),
    )


@needs_c
@pytest.mark.parametrize("pattern", [QWEN, CL100K], ids=["qwen2", "cl100k"])
@settings(max_examples=1500, deadline=None)
@given(text=ascii_texts())
def test_ascii_text_gives_tiktokens_ids_in_c(spec: TiktokenSpec, pattern: str, text: str) -> None:
    ref, fast = pair(spec, pattern)
    before = fast.fallbacks
    assert fast.encode(text) == ref(text)
    assert fast.fallbacks == before  # ASCII never falls back: the C path answered


@needs_c
@pytest.mark.parametrize("pattern", [QWEN, CL100K], ids=["qwen2", "cl100k"])
@settings(max_examples=300, deadline=None)
@given(text=st.one_of(
    st.text(max_size=60),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.sampled_from(["é", "e\u0301", "数据", "🙂", "\u00a0", "١٢"])),
             max_size=30).map("".join),
))
def test_any_text_gives_tiktokens_ids(spec: TiktokenSpec, pattern: str, text: str) -> None:
    ref, fast = pair(spec, pattern)
    assert fast.encode(text) == ref(text)


@needs_c
def test_long_pieces_and_long_text(spec: TiktokenSpec) -> None:
    ref, fast = pair(spec, QWEN)
    before = fast.fallbacks
    texts = [
        "-" * 300, "xq" * 200, "zqxjkvbw" * 40 + "!?" * 150, " " * 1000 + "a", "\n" * 500,  # merged off the stack
        ("Ticket 12: the refund's status isn't clear.\n\n  - see https://x.example/a?b=1\t" * 400),  # no GIL
    ]
    for text in texts:
        assert fast.encode(text) == ref(text)
    assert fast.fallbacks == before


@needs_c
def test_a_vocabulary_without_some_byte_falls_back_whole() -> None:
    ranks = {bytes([b]): b for b in range(256) if b != ord("z")} | {b"ab": 256}
    fast = _bpe.Bpe(ranks, 1, lambda text: [999])
    assert fast.encode("ab ab") == [256, ord(" "), 256]  # " ab" is no token: merged in C
    assert fast.encode("ab z") == [999] and fast.fallbacks == 1
    assert fast.encode("ab é") == [256, 999] and fast.fallbacks == 2


def _mapped_kb() -> int:
    """The process's virtual memory (VmSize), kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1])
    raise AssertionError("no VmSize")


@needs_c
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc/self/status")
def test_a_table_is_one_mapping_freed_with_it_and_on_every_refusal() -> None:
    """The ranks' table lives in a mapping of its own (huge pages advised, at least 2 MB): dropped with the table,
    and when the ranks are refused or the table is initialised twice; a leak would keep 2 MB a table."""
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256}
    before = _mapped_kb()
    for _ in range(64):
        fast = _bpe.Bpe(ranks, 1, lambda text: [999])
        assert fast.encode("ab ab") == [256, ord(" "), 256]
        with pytest.raises(RuntimeError, match="once"):
            fast.__init__(ranks, 1, lambda text: [999])  # type: ignore[misc]
        assert fast.encode("ab ab") == [256, ord(" "), 256]  # the first table is still there
        with pytest.raises(ValueError, match="values"):
            _bpe.Bpe(ranks | {b"bc": -1}, 1, lambda text: [999])
        del fast
    assert _mapped_kb() - before < 16 << 10  # 64 tables leaked would be >= 128 MB


@needs_c
def test_only_the_stretch_around_a_non_ascii_character_goes_to_tiktoken(spec: TiktokenSpec) -> None:
    ref, _ = pair(spec, QWEN)
    asked: list[str] = []
    fast = _bpe.Bpe(spec.ranks, 1, lambda text: (asked.append(text), ref(text))[1])
    text = "The customer\u2019s refund isn\u2019t here yet. Please check the status \U0001f642 and reply today."
    assert fast.encode(text) == ref(text)
    assert asked == [" customer\u2019s", " isn\u2019t", " \U0001f642 and"]
    for text in ("\u00e9", "caf\u00e9", "\u00e9 x", "a \u00e9", "\u6570\u636e data", "data \u6570\u636e"):
        assert fast.encode(text) == ref(text)


MIXED = [*FRAGMENTS, "word ", " word", "x ", "X y", "\u00e9", "\u2019", "\u201c", "\u2014", "\u00a0", "\u2028",
         "\u3000", "\u6570\u636e", "\U0001f642", "e\u0301",
         "\u0661\u0662", "\u00b2", "\u017f", "\u212a", "\u0130", "\x85"]


@needs_c
@pytest.mark.parametrize("pattern", [QWEN, CL100K], ids=["qwen2", "cl100k"])
@settings(max_examples=1500, deadline=None)
@given(text=st.lists(st.sampled_from(MIXED), max_size=40).map("".join))
def test_mostly_ascii_text_with_other_characters(spec: TiktokenSpec, pattern: str, text: str) -> None:
    ref, fast = pair(spec, pattern)
    assert fast.encode(text) == ref(text)


def test_only_known_patterns_and_not_in_pure_python(spec: TiktokenSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    def fallback(text: str) -> list[int]:
        return []

    assert bpe.ordinary(QWEN.replace(r"\p{N}", r"\p{N}+"), spec.ranks, fallback) is None
    monkeypatch.setenv(ENV, "1")
    assert bpe.ordinary(QWEN, spec.ranks, fallback) is None


def test_the_codec_encodes_in_c_where_a_compiler_and_headers_are(qwen_tokenizer_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("gcc") is None or not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no C compiler or Python headers here: tiktoken encodes by design")
    from infera.kv.tokenizer import PromptRenderer

    monkeypatch.delenv(ENV, raising=False)
    assert _bpe is not None, "gcc and Python.h are here but infera.kv._bpe is not built: run ./scripts/setup"
    codec: Any = PromptRenderer.from_dir(qwen_tokenizer_dir)._codec
    assert isinstance(codec._ordinary.__self__, _bpe.Bpe)


SPECIAL_ISH = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_end", "<|im_end|", "<<|im_end|>", "<|nope|>",
               "<|im_start|><|im_end|>", "<", ">", "<|", "|>", "<>", "\u0338", "\u00e9", "\U0001f642", "\u6570\u636e"]
_chat_pair: dict[str, Any] = {}


def chat_pair(spec: TiktokenSpec) -> tuple[Any, Any]:
    """(tiktoken with Qwen's specials, the C table) for Qwen's pattern."""
    if not _chat_pair:
        ref = tiktoken.Encoding("refs", pat_str=QWEN, mergeable_ranks=spec.ranks, special_tokens=spec.specials)
        _chat_pair["ref"] = ref
        _chat_pair["fast"] = _bpe.Bpe(spec.ranks, 1, ref.encode_ordinary)
    return _chat_pair["ref"], _chat_pair["fast"]


@needs_c
@settings(max_examples=1500, deadline=None)
@given(text=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.sampled_from(SPECIAL_ISH), st.sampled_from(MIXED)),
                     max_size=60).map("".join))
def test_a_chat_text_split_on_its_specials_and_packed_in_one_call_gives_tiktokens_ids(spec: TiktokenSpec,
                                                                                       text: str) -> None:
    from array import array

    ref, fast = chat_pair(spec)
    assert len({n[0] for n in spec.specials} | {n[-1] for n in spec.specials}) == 2  # ChatML-like: "<", ">"
    got = array("I", fast.encode_chat(text, "<", ">", spec.specials)).tolist()
    assert got == ref.encode(text, allowed_special="all", disallowed_special=())


def test_the_codecs_packed_fresh_text_equals_its_fresh_text(qwen_tokenizer_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """What the prompt cache appends for a request's fresh text (one C call) equals encode_fresh's ids, short texts
    (which encode_fresh gives tiktoken whole) and long ones (split in Python, each piece in C) alike."""
    from array import array

    from infera.kv.tokenizer import PromptRenderer

    monkeypatch.delenv(ENV, raising=False)
    codec: Any = PromptRenderer.from_dir(qwen_tokenizer_dir)._codec
    packer = codec.fresh_packer
    if _bpe is None:
        assert packer is None
        return
    assert packer is not None
    words = [*FRAGMENTS, *SPECIAL_ISH, "assistant\n", "user\n", " Request", " tenant", "\u00c5ngstr\u00f6m", "A\u030a"]
    rng = __import__("random").Random(5)
    texts = ["", "assistant\n", "<|im_end|>\n<|im_start|>assistant\n", "\n"]
    texts += ["".join(rng.choice(words) for _ in range(rng.randrange(1, 400))) for _ in range(300)]
    for text in texts:
        assert array("I", packer(text)).tolist() == codec.encode_fresh(text) == codec.encode(
            text, False)
