"""Short chats of plain messages rendered from a recipe (infera.kv.plain_render): the template's text, always."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera.kv.chat_template import CHATML_TEMPLATE, ContentFormat, make_env, normalize_messages
from infera.kv.codecs import BYTE_LEVEL_SPECIALS, ByteCodec
from infera.kv.plain_render import plain_safe
from infera.kv.tokenizer import ChatTemplateError, PromptRenderer
from tests.conftest import TINY_CHATML
from tests.kv.test_tokenizer import SMOL_TEMPLATE

SPECIAL = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

# Proven templates that read what a recipe's key must hold: a content's truth (``if``, ``or``, ``not``, an
# ``if``-expression), the roles of neighbours and of a fixed message, the length, ``loop.last``, the
# generation prompt, a content outside the loop (first and last message), a content twice, an error raised
# for some shapes.
TRUTH_TEMPLATE = (
    "{{ messages[0]['content'] + '|' + messages[0].role }}{% for m in messages %}"
    "{% if m.content %}[{{ m.role }}]{{ m.content }}{% else %}(empty {{ m.role }}){% endif %}"
    "{{ (m.content or '-') ~ '|' ~ loop.index }}{{ '<' + m.content + '>' if not m.content else m.role }}"
    "{{ m.content and 'T' }}{{ not m.content }}{% if loop.last %}!{% endif %}"
    "<{{ messages[loop.index0 - 1].role }}>"
    "{% if messages[loop.index0 + 1] is defined %}>{{ messages[loop.index0 + 1].role }}{% endif %}"
    "{% if m.role == 'tool' and loop.first %}{{ raise_exception('a tool first') }}{% endif %}\n"
    "{% endfor %}{{ messages | length }}{{ messages[-1].content }}{% set e = not messages[0].content %}{{ e }}"
    "{% if add_generation_prompt %}<gen>{% endif %}"
)
TOOLS_FIRST = (  # Qwen's shape: the header reads the first message, tool turns read their neighbours
    "{% if messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{% else %}<|im_start|>system\\nDefault<|im_end|>\\n{% endif %}"
    "{% for message in messages %}{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{% elif message.role == 'tool' %}{% if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "<|im_start|>user{% endif %}\\n<tool_response>\\n{{ message.content }}\\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\\n{% endif %}"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant{% if message.content %}\\n{{ message.content }}"
    "{% endif %}{% for call in message.tool_calls %}<tool_call>{{ call | tojson }}{% endfor %}<|im_end|>\\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}"
)
PROVEN = {"chatml": CHATML_TEMPLATE, "tiny": TINY_CHATML, "truth": TRUTH_TEMPLATE, "tools first": TOOLS_FIRST}

# Templates whose output reads a content otherwise than verbatim or by its truth, a message whole, captured
# output or something impure: no recipe.
UNPROVEN = {
    "trim": "{% for m in messages %}{{ m.content | trim }}{% endfor %}",
    "tojson": "{% for m in messages %}{{ m.content | tojson }}{% endfor %}",
    "length": "{% for m in messages %}{{ m.content | length }}{% endfor %}",
    "slice": "{% for m in messages %}{{ m.content[:4] }}{% endfor %}",
    "method": "{% for m in messages %}{{ m.content.upper() }}{% endfor %}",
    "test": "{% for m in messages %}{{ 'S' if m.content is string }}{{ m.role }}{% endfor %}",
    "compare": "{% for m in messages %}{% if m.content == 'hi' %}!{% endif %}{{ m.role }}{% endfor %}",
    "in": "{% for m in messages %}{% if 'a' in m.content %}!{% endif %}{{ m.role }}{% endfor %}",
    "set": "{% for m in messages %}{% set c = m.content %}{{ c }}{% endfor %}",
    "alias": "{% set first = messages[0] %}{{ first.content }}{% for m in messages %}{{ m.role }}{% endfor %}",
    "message whole": "{% for m in messages %}{{ m | tojson }}{% endfor %}",
    "messages whole": "{{ messages | tojson }}",
    "messages slice": "{% for m in messages[1:] %}{{ m.content }}{% endfor %}",
    "reversed": "{% for m in messages | reverse %}{{ m.content }}{% endfor %}",
    "previtem": "{% for m in messages %}{{ loop.previtem }}{{ m.role }}{% endfor %}",
    "captured": "{% for m in messages %}{% set x %}{{ m.content }}{% endset %}{{ x | length }}{% endfor %}",
    "macro": "{% macro f(x) %}{{ x }}{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}",
    "strftime": "{% for m in messages %}{{ strftime_now('%S') }}{{ m.content }}{% endfor %}",
    "name operand": "{% for m in messages %}{{ bos_token + m.content }}{% endfor %}",
    "markup operand": "{% for m in messages %}{{ m.content + ('<b>' | safe) }}{% endfor %}",
    "index by content": "{% for m in messages %}{{ messages[m.content | length % 2].role }}{% endfor %}",
    "loop over content": "{% for m in messages %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}",
    "target reused": "{% for m in messages %}{{ m.content }}{% endfor %}{% for m in [{'content': 1}] %}{% endfor %}",
}


def _qwen_template(qwen_tokenizer_dir: Path) -> str:
    config = json.loads((qwen_tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    template: str = config["chat_template"]
    return template


@functools.cache
def _compiled(template: str) -> jinja2.Template:
    return make_env().from_string(template)


def _whole(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool,
           fmt: ContentFormat = "string") -> str:
    """The template alone: jinja's ``Template.render`` (no renderer, no cache), errors as text."""
    try:
        return _compiled(template).render(messages=normalize_messages(messages, fmt), tools=None,
                                                documents=None, add_generation_prompt=add_generation_prompt,
                                                **SPECIAL)
    except jinja2.TemplateError as exc:
        return f"error: chat template failed: {exc}"


def _render(renderer: PromptRenderer, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    try:
        return renderer.render_chat(messages, add_generation_prompt=add_generation_prompt)
    except ChatTemplateError as exc:
        return f"error: {exc}"


# ---------------------------------------------------------------------------------------
# Random conversations: shared prefixes, edits in the middle, unicode, the markers' own characters

_TEXT = st.lists(st.sampled_from(["a", " ", "\n", "é", "毕", "😀", "\ue000", "\ue001", ":", "0", "1", "<", "|",
                                  "im_start", "<|im_end|>", "{{", "%"]), max_size=8).map("".join)
_ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer"])


@st.composite
def _message(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.integers(0, 9))
    msg: dict[str, Any] = {"role": draw(_ROLES), "content": draw(_TEXT)}
    if kind == 0:  # not plain: the whole template renders it
        msg["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"v": 1}'}}]
    elif kind == 1:
        msg["content"] = draw(st.sampled_from([None, [{"type": "text", "text": "part"}]]))
    elif kind == 2:
        msg = {"content": msg["content"], "role": msg["role"]}  # another key order: still plain
    return msg


@st.composite
def _conversations(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """Requests sharing prefixes: next turns, branches, an edit in the middle, the same one again."""
    prefix = draw(st.lists(_message(), min_size=1, max_size=6))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        roll = draw(st.integers(0, 3))
        if roll == 0:
            convo = [*prefix, *draw(st.lists(_message(), min_size=1, max_size=3))]
        elif roll == 1 and prefix:
            i = draw(st.integers(0, len(prefix) - 1))
            convo = [*prefix[:i], draw(_message()), *prefix[i + 1:]]
        elif roll == 2:
            convo = json.loads(json.dumps(prefix))
        else:
            convo = draw(st.lists(_message(), min_size=1, max_size=12))
        out.append(convo)
        if draw(st.booleans()):
            prefix = convo
    return out


@pytest.mark.parametrize("name", [*PROVEN, "smol", "qwen"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=_conversations(), generation=st.booleans())
def test_recipe_render_equals_the_whole_template_on_random_conversations(
        name: str, requests: list[list[dict[str, Any]]], generation: bool, qwen_tokenizer_dir: Path) -> None:
    template = {**PROVEN, "smol": SMOL_TEMPLATE, "qwen": _qwen_template(qwen_tokenizer_dir)}[name]
    renderer = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": template}, SPECIAL)
    if name != "smol":
        assert "default" in renderer.plain_recipes
    for messages in requests:
        assert _render(renderer, messages, generation) == _whole(template, messages, generation)


@pytest.mark.parametrize("name", list(PROVEN))
def test_proven_templates_render_plain_chats_from_recipes(name: str) -> None:
    renderer = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": PROVEN[name]}, SPECIAL)
    recipes = renderer.plain_recipes["default"]
    chats = [[{"role": "system", "content": "s"}, {"role": "user", "content": f"q{i}"}] for i in range(5)]
    chats.append([{"role": "user", "content": ""}, {"role": "assistant", "content": "a"},
                  {"role": "user", "content": "b"}])
    for messages in chats:
        assert _render(renderer, messages, True) == _whole(PROVEN[name], messages, True)
    assert recipes.learnt == 2  # one shape per role sequence and empty contents, rendered with stand-ins once


@pytest.mark.parametrize("name", list(UNPROVEN))
def test_templates_reading_contents_otherwise_get_no_recipe(name: str) -> None:
    template = UNPROVEN[name]
    assert not plain_safe(make_env().parse(template))
    renderer = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": template}, SPECIAL)
    assert renderer.plain_recipes == {}
    for content in ("hi", "a b ", "", "<x>"):
        messages = [{"role": "user", "content": content}, {"role": "assistant", "content": content + "!"}]
        assert _render(renderer, messages, True) == _whole(template, messages, True, renderer.content_format())


def test_qwen_token_ids_from_a_recipe_equal_the_whole_render_and_encode(qwen_tokenizer_dir: Path) -> None:
    """Render from recipes + the prompt cache's incremental encode == the template alone + a plain encode."""
    r = PromptRenderer.from_dir(qwen_tokenizer_dir)
    assert r.prompt_cache is not None and "default" in r.plain_recipes
    r.prompt_cache.min_chars = 0
    template = _qwen_template(qwen_tokenizer_dir)
    system = {"role": "system", "content": "You are helpful. 毕老师 says hi.\n" * 20}
    history = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4, 😀."}]
    for i in range(30):
        turn = {"role": "user", "content": f"Ticket {i}: é{'x' * i} <|im_start|> {i * 7919}"}
        messages = [system, *history[: i % 3], turn]
        whole = env_render(template, messages, True, r.special_tokens)
        assert r.render_chat(messages) == whole
        assert list(r.encode_chat_ids(r.render_chat(messages))) == r.encode(whole)
        assert r.chat_token_ids(messages) == r.encode(whole)
    assert r.plain_recipes["default"].learnt == 3


def env_render(template: str, messages: list[dict[str, Any]], generation: bool, special: dict[str, str]) -> str:
    return _compiled(template).render(messages=messages, tools=None, documents=None,
                                                   add_generation_prompt=generation, **special)


def test_tools_kwargs_and_long_chats_render_through_jinja() -> None:
    renderer = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": CHATML_TEMPLATE}, SPECIAL)
    recipes = renderer.plain_recipes["default"]
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert renderer.render_chat(messages, tools=tools) == make_env().from_string(CHATML_TEMPLATE).render(
        messages=messages, tools=tools, add_generation_prompt=True)
    renderer.render_chat(messages, enable_thinking=False)
    renderer.render_chat(messages * (recipes.max_messages + 1))
    renderer.render_chat(messages, add_generation_prompt=1)  # type: ignore[arg-type]  # not a bool: no key
    assert recipes.learnt == 0


@pytest.mark.parametrize("name", list(PROVEN))
def test_primed_shapes_are_the_recipes_their_requests_learn(name: str) -> None:
    """A server primes the common chats' shapes at start: each recipe equals the one a first request of that
    shape learns, a primed shape's requests learn nothing more and render the template's text, others still
    learn."""
    template = PROVEN[name]
    primed = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": template}, SPECIAL)
    lazy = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": template}, SPECIAL)
    recipes = primed.plain_recipes["default"]
    count = primed.prime_plain_chats()
    assert count == recipes.learnt == 11  # 1..11 messages without a system message, 2..10 with one
    assert primed.prime_plain_chats() == 0 and recipes.learnt == 11
    chats = []
    for system in (False, True):
        for n in range(1 + system, recipes.max_messages + 1, 2):
            turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{name} <{i}> é"}
                     for i in range(n - system)]
            chats.append(([{"role": "system", "content": "sys"}] if system else []) + turns)
    for messages in chats:
        assert _render(primed, messages, True) == _whole(template, messages, True)
        assert _render(lazy, messages, True) == _whole(template, messages, True)
    assert recipes.learnt == 11 and lazy.plain_recipes["default"].learnt == 11
    assert recipes._recipes == lazy.plain_recipes["default"]._recipes
    odd = [{"role": "user", "content": "q"}, {"role": "user", "content": ""}]  # not a primed shape: learnt
    assert _render(primed, odd, True) == _whole(template, odd, True)
    assert recipes.learnt == 12


def test_a_renderer_without_a_template_or_recipes_primes_nothing() -> None:
    assert PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {}, SPECIAL).prime_plain_chats() == 0
    unproven = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": UNPROVEN["trim"]}, SPECIAL)
    assert unproven.prime_plain_chats() == 0
