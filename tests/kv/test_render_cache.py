"""The per-message render cache (infera.kv.render_cache): the same text as the whole template, always."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from infera.kv.chat_template import CHATML_TEMPLATE, make_env
from infera.kv.codecs import BYTE_LEVEL_SPECIALS, ByteCodec
from infera.kv.template_split import split_template
from infera.kv.tokenizer import ChatTemplateError, PromptRenderer
from tests.conftest import TINY_CHATML
from tests.kv.test_tokenizer import PARTS_TEMPLATE, SMOL_TEMPLATE

SPECIAL = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

# Templates that exercise every dependency a body may have: the loop's position and length, its
# neighbours (with Python's negative index at the first message), a fixed message, a render variable,
# tool calls through tojson (1, 1.0 and True render differently), an error raised mid-loop.
NEIGHBOURS_TEMPLATE = (
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}:{{ m.role }}"
    "{% if loop.last %}!{% endif %}{% if loop.first %}^{% endif %}"
    "<{{ messages[loop.index0 - 1].role }}>"
    "{% if messages[loop.index0 + 1] is defined %}>{{ messages[loop.index0 + 1].role }}{% endif %}"
    "[{{ messages[0].content[:4] if messages[0].content is string else '' }}]"
    "{{ m.content if m.content is string else m.content | tojson }}{{ suffix }}"
    "{% for c in m.tool_calls or [] %}{% set f = c.function %}({{ f.name }} {{ f.arguments | tojson }}"
    "{% if loop.last %}.{% endif %}){% endfor %}"
    "{% if m.role == 'tool' and m.content == 'boom' %}{{ raise_exception('no boom') }}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}<gen>{% endif %}{{ tools | tojson if tools else '' }}"
)
LENGTH_TEMPLATE = (
    "{{ messages | length }}{% for m in messages %}{{ loop.revindex }} {{ loop.length }} {{ m.role }}"
    "{{ m.content }}\n{% endfor %}"
)
# Shapes that must not be split (state across iterations, or messages read whole in the body).
UNSPLIT = {
    "namespace": ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                  "{{ ns.n }}{{ m.content }}{% endfor %}"),
    "outer set": "{% set p = '>' %}{% for m in messages %}{{ p }}{{ m.content }}{% endfor %}",
    "body set": "{% for m in messages %}{% set x = m.content %}{{ x }}{% endfor %}",
    "messages whole": "{% for m in messages %}{{ messages | length }}{{ m.content }}{% endfor %}",
    "messages slice": "{% for m in messages %}{{ messages[1:] | length }}{{ m.content }}{% endfor %}",
    "two loops": "{% for m in messages %}{{ m.content }}{% endfor %}{% for m in messages %}{{ m.role }}{% endfor %}",
    "nested loop": "{% if messages %}{% for m in messages %}{{ m.content }}{% endfor %}{% endif %}",
    "break": "{% for m in messages %}{% if m.role == 'tool' %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
    "loop.cycle": "{% for m in messages %}{{ loop.cycle('a', 'b') }}{{ m.content }}{% endfor %}",
    "previtem": "{% for m in messages %}{{ loop.previtem }}{{ m.content }}{% endfor %}",
    "strftime": "{% for m in messages %}{{ strftime_now('%Y') }}{{ m.content }}{% endfor %}",
    "macro": "{% macro f(x) %}{{ x }}{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}",
    "generation": "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
    "filtered loop": "{% for m in messages if m.role != 'system' %}{{ m.content }}{% endfor %}",
}


def _qwen_template(qwen_tokenizer_dir: Path) -> str:
    config = json.loads((qwen_tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    template: str = config["chat_template"]
    return template


def _renderers(template: str, bodies_min: int = 1) -> tuple[PromptRenderer, PromptRenderer]:
    """(with the render cache, without it): the second renders every prompt whole. ``bodies_min``: reused
    bodies below which the cache renders the whole template, marked (1: per message whenever it can)."""
    cached = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": template}, SPECIAL)
    whole = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": template}, SPECIAL)
    for cache in cached.render_caches.values():
        cache.min_messages = 1
        cache.bodies_min = bodies_min
    for cache in whole.render_caches.values():
        cache.min_messages = 1 << 30
    for renderer in (cached, whole):  # short chats of plain messages: not from recipes (tests/kv/test_plain_render.py)
        for recipes in renderer.plain_recipes.values():
            recipes.max_messages = 0
    return cached, whole


# ---------------------------------------------------------------------------------------
# Random conversations, and how a client moves between them

_WORDS = ["hi", "Zürich", "毕老师", "😀", "a\nb", "<|im_start|>", "{}", " ", "x" * 40, "boom?", "-0.0", "1"]
_VALUES: list[Any] = [1, 1.0, True, "1", None, -0.0, 0.0, [1, 2], {"b": 1, "a": 2}, {"a": 2, "b": 1}]


def _content(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.7:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 6)))
    if roll < 0.8:
        return None
    return [{"type": "text", "text": rng.choice(_WORDS)} if rng.random() < 0.8 else {"type": "image_url"}
            for _ in range(rng.randint(1, 3))]


def _message(rng: random.Random) -> dict[str, Any]:
    role = rng.choice(["user", "user", "assistant", "assistant", "system", "tool"])
    msg: dict[str, Any] = {"role": role, "content": _content(rng)}
    if role == "assistant" and rng.random() < 0.3:
        args: Any = {"v": rng.choice(_VALUES)}
        msg["tool_calls"] = [{"id": "c", "type": "function",
                              "function": {"name": rng.choice(["f", "g"]),
                                           "arguments": json.dumps(args) if rng.random() < 0.5 else args}}]
    if role == "tool":
        msg["tool_call_id"] = "c"
        if rng.random() < 0.1:
            msg["content"] = "boom"
    if rng.random() < 0.1:
        msg["name"] = rng.choice(["n", "m"])
    if rng.random() < 0.1:
        msg = {"content": msg["content"], **msg}  # another key order
    return msg


def _steps(rng: random.Random, n: int) -> list[list[dict[str, Any]]]:
    """A client's requests: next turns mostly, and branches, edits, repeats, type changes in between."""
    out: list[list[dict[str, Any]]] = []
    convo = [_message(rng) for _ in range(rng.randint(1, 8))]
    for _ in range(n):
        roll = rng.random()
        if roll < 0.55 or not convo:
            convo = convo + [_message(rng) for _ in range(rng.randint(1, 3))]
        elif roll < 0.7:
            convo = [*convo[: rng.randint(0, len(convo))], _message(rng)]
        elif roll < 0.8:
            i = rng.randrange(len(convo))
            edited = json.loads(json.dumps(convo[i]))
            calls = edited.get("tool_calls")
            if calls and isinstance(calls[0]["function"]["arguments"], dict):
                calls[0]["function"]["arguments"]["v"] = rng.choice(_VALUES)  # 1 -> 1.0, True, ...
            else:
                edited["content"] = _content(rng)
            convo = [*convo[:i], edited, *convo[i + 1:]]
        elif roll < 0.9:
            convo = json.loads(json.dumps(convo))  # the same conversation, parsed again
        else:
            convo = [_message(rng) for _ in range(rng.randint(1, 12))]  # another session
        out.append(convo)
    return out


def _render(renderer: PromptRenderer, messages: list[dict[str, Any]], **kw: Any) -> str:
    """The text, or the template's error as text (both paths must raise the same)."""
    try:
        return renderer.render_chat(messages, **kw)
    except ChatTemplateError as exc:
        return f"error: {exc}"


def _same(cached: PromptRenderer, whole: PromptRenderer, messages: list[dict[str, Any]], **kw: Any) -> None:
    assert _render(cached, messages, **kw) == _render(whole, json.loads(json.dumps(messages)), **kw)


TEMPLATES = {"chatml": CHATML_TEMPLATE, "tiny": TINY_CHATML, "smol": SMOL_TEMPLATE, "parts": PARTS_TEMPLATE,
             "neighbours": NEIGHBOURS_TEMPLATE, "length": LENGTH_TEMPLATE}


@pytest.mark.parametrize("name", [*TEMPLATES, "qwen"])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_render_equals_whole_render_on_random_conversations(
    name: str, seed: int, request: pytest.FixtureRequest
) -> None:
    template = _qwen_template(request.getfixturevalue("qwen_tokenizer_dir")) if name == "qwen" else TEMPLATES[name]
    cached, whole = _renderers(template, bodies_min=[1, 1, 4, 1_000_000][seed % 4])  # per message / marked
    assert cached.render_caches, f"{name} should split"
    rng = random.Random(f"{name}-{seed}")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for messages in _steps(rng, 60):
        kw: dict[str, Any] = {}
        if rng.random() < 0.2:
            kw["add_generation_prompt"] = False
        if rng.random() < 0.2:
            kw["tools"] = tools
        if rng.random() < 0.3:
            kw["suffix"] = rng.choice(["", "~", 1, 1.0])  # a variable the neighbours template's body reads
        _same(cached, whole, messages, **kw)
    cache = cached.render_caches["default"]
    if name == "length" or cache.bodies_min == 1_000_000:
        assert cache.reused == 0  # every body read the length, which the next turn changes; or always marked
    else:
        assert cache.reused > 0  # the next turns did reuse bodies
    assert cache.entries > 0


def test_a_growing_conversation_renders_only_its_new_messages(qwen_tokenizer_dir: Path) -> None:
    cached, whole = _renderers(_qwen_template(qwen_tokenizer_dir))
    cache = cached.render_caches["default"]
    convo: list[dict[str, Any]] = [{"role": "system", "content": "Be terse."}]
    for turn in range(20):
        convo = [*convo, {"role": "user", "content": f"question {turn}"}]
        before = cache.rendered
        assert cached.render_chat(convo) == whole.render_chat(convo)
        if turn >= 3:  # from 8 messages: over half of them reused, rendered per message
            assert cache.rendered - before <= 2  # the new message and the one before it at most
        convo = [*convo, {"role": "assistant", "content": f"answer {turn}"}]
    assert cache.entries == 1  # one entry per conversation


def test_equal_values_of_other_types_are_not_reused() -> None:
    cached, whole = _renderers(NEIGHBOURS_TEMPLATE)
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"v": 1}}}]}
    head = [{"role": "user", "content": "q"}, call]
    for v in (1, 1.0, True, -0.0, 0.0, 0):
        convo = json.loads(json.dumps(head))
        convo[1]["tool_calls"][0]["function"]["arguments"]["v"] = v
        convo.append({"role": "user", "content": "next"})
        assert cached.render_chat(convo) == whole.render_chat(convo)
    for suffix in (1, 1.0, True, "1"):
        assert cached.render_chat(head, suffix=suffix) == whole.render_chat(head, suffix=suffix)


def test_a_callers_later_change_to_its_messages_does_not_reach_the_cache() -> None:
    cached, whole = _renderers(CHATML_TEMPLATE)
    convo: list[dict[str, Any]] = [{"role": "user", "content": f"m{i}"} for i in range(8)]
    cached.render_chat(convo)
    convo[3]["content"] = "changed"
    assert cached.render_chat(convo) == whole.render_chat(convo)


@pytest.mark.parametrize("name", sorted(UNSPLIT))
def test_templates_with_state_across_messages_are_rendered_whole(name: str) -> None:
    assert split_template(make_env(), UNSPLIT[name]) is None
    cached, whole = _renderers(UNSPLIT[name])
    rng = random.Random(name)
    for messages in _steps(rng, 10):
        plain = [{"role": m["role"], "content": str(m["content"])} for m in messages]
        if name != "strftime":
            _same(cached, whole, plain)


@pytest.mark.parametrize("template", [CHATML_TEMPLATE, NEIGHBOURS_TEMPLATE])
def test_the_cache_stays_within_its_bound(template: str) -> None:
    cached, whole = _renderers(template)
    cache = cached.render_caches["default"]
    cache.max_bytes = 20_000
    rng = random.Random(3)
    for s in range(60):
        convo = [{"role": "user", "content": f"session {s} " + "x" * rng.randint(0, 400)} for _ in range(10)]
        assert cached.render_chat(convo) == whole.render_chat(convo)
        assert cache.size_bytes <= cache.max_bytes or cache.entries == 1
    assert 1 <= cache.entries < 60


def test_token_ids_through_both_caches_equal_the_whole_encode(qwen_tokenizer_dir: Path) -> None:
    r = PromptRenderer.from_dir(qwen_tokenizer_dir)
    assert r.prompt_cache is not None and "default" in r.render_caches
    r.prompt_cache.min_chars = 0
    rng = random.Random(5)
    for messages in _steps(rng, 40):
        plain = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else "x"}
                 for m in messages if m["role"] != "tool"]
        if plain:
            ids = r.chat_token_ids(plain)
            assert ids == r.encode(r._pick(None, None)[0].render(  # the template alone, then a plain encode
                messages=plain, tools=None, documents=None, add_generation_prompt=True, **r.special_tokens))
