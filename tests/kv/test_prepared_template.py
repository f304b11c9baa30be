"""PreparedTemplate (infera.kv.chat_template): the text and the errors of jinja's own ``Template.render``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import jinja2
import pytest

from infera.kv.chat_template import CHATML_TEMPLATE, PreparedTemplate, make_env, normalize_messages
from infera.kv.codecs import BYTE_LEVEL_SPECIALS, ByteCodec
from infera.kv.tokenizer import ChatTemplateError, PromptRenderer
from tests.conftest import TINY_CHATML
from tests.kv.test_render_cache import LENGTH_TEMPLATE, NEIGHBOURS_TEMPLATE, UNSPLIT, _qwen_template, _steps
from tests.kv.test_tokenizer import PARTS_TEMPLATE, SMOL_TEMPLATE, TOOLS

SPECIAL = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
TEMPLATES: dict[str, str] = {
    "chatml": CHATML_TEMPLATE, "tiny": TINY_CHATML, "smol": SMOL_TEMPLATE, "parts": PARTS_TEMPLATE,
    "neighbours": NEIGHBOURS_TEMPLATE, "length": LENGTH_TEMPLATE, **UNSPLIT,
    "blocks": "{% block head %}[{{ bos_token }}]{% endblock %}{% for m in messages %}{{ m.role }}{% endfor %}",
    "set leaks?": "{{ x is defined }}{% set x = 1 %}{% for m in messages %}{{ m.content }}{% endfor %}{{ x }}",
    "globals read": "{{ dict(a=1) | tojson }}{{ namespace(a=2).a }}{% for m in messages %}{{ m.role }}{% endfor %}",
    "attributes": "{% set ns = namespace(a=1) %}{% for m in messages %}{{ m.role }}|{{ m.name is defined }}|"
                  "{{ m.items is defined }}|{{ m.get('content') }}|{{ ns.a }}|{{ m.nope }}|{{ m.role.upper() }}|"
                  "{{ (m.tool_calls or [{}])[0].function }}|{{ loop.index }}{% endfor %}",
    "autoescape": "{% autoescape true %}{{ '<b>' }}{% endautoescape %}{{ '<i>' }}{{ messages | length }}",
}


def _outcome(render: Any) -> tuple[str, Any]:
    """("ok", text) or ("error", (type, message)): what a render gave."""
    try:
        return "ok", render()
    except Exception as exc:
        return "error", (type(exc), str(exc))


def _variables(rng: random.Random, messages: list[dict[str, Any]], fmt: Any) -> dict[str, Any]:
    tools = TOOLS if rng.random() < 0.3 else None
    out: dict[str, Any] = {"messages": normalize_messages(messages, fmt), "tools": tools, "documents": None,
                           "add_generation_prompt": rng.random() < 0.7, **SPECIAL}
    if rng.random() < 0.3:
        out["suffix"] = rng.choice(["", "~", 1])
    return out


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_renders_equal_jinja_over_random_conversations(name: str) -> None:
    env = make_env()
    template = env.from_string(TEMPLATES[name])
    prepared = PreparedTemplate(template)
    rng = random.Random(name)
    seen = set()
    for messages in _steps(rng, 60):
        for fmt in ("string", "openai"):
            variables = _variables(rng, messages, fmt)
            want = _outcome(lambda v=variables: template.render(**v))
            got = _outcome(lambda v=variables: prepared.render(dict(v)))
            assert got == want, (name, messages)
            seen.add(want[0])
    assert "ok" in seen


def test_qwen_template_renders_equal_jinja(qwen_tokenizer_dir: Path) -> None:
    env = make_env()
    template = env.from_string(_qwen_template(qwen_tokenizer_dir))
    prepared = PreparedTemplate(template)
    rng = random.Random(3)
    for messages in _steps(rng, 150):
        variables = _variables(rng, messages, "string")
        variables["enable_thinking"] = rng.choice([True, False, None])
        want = _outcome(lambda v=variables: template.render(**v))
        assert _outcome(lambda v=variables: prepared.render(v)) == want


def test_a_render_neither_keeps_nor_changes_what_it_was_given() -> None:
    env = make_env()
    prepared = PreparedTemplate(env.from_string(TEMPLATES["set leaks?"]))
    variables = {"messages": [{"role": "user", "content": "a"}]}
    assert prepared.render(variables) == "Falsea1"
    assert prepared.render(variables) == "Falsea1"  # the first render's {% set %} is gone
    assert variables == {"messages": [{"role": "user", "content": "a"}]}
    assert prepared.globals == dict(env.from_string("").globals)  # the globals, untouched by renders


def test_variables_override_globals_as_in_jinja() -> None:
    env = make_env()
    source = "{{ raise_exception }}|{{ bos_token }}"
    variables = {"raise_exception": "mine", "bos_token": "<s>"}
    assert PreparedTemplate(env.from_string(source)).render(variables) == env.from_string(source).render(**variables)


def test_an_error_raises_as_jinja_raises_it() -> None:
    env = make_env()
    source = "{% for m in messages %}{{ raise_exception('no ' + m.role) }}{% endfor %}"
    with pytest.raises(jinja2.TemplateError, match=r"^no user$"):
        PreparedTemplate(env.from_string(source)).render({"messages": [{"role": "user", "content": ""}]})
    with pytest.raises(jinja2.UndefinedError):
        PreparedTemplate(env.from_string("{{ x.y.z }}")).render({})


def test_renderer_output_unchanged_and_errors_still_chat_template_errors() -> None:
    bad = "{{ raise_exception('nope') }}"
    renderer = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": CHATML_TEMPLATE, "bad": bad}, SPECIAL)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    want = make_env().from_string(CHATML_TEMPLATE).render(messages=messages, tools=None, documents=None,
                                                          add_generation_prompt=True, **SPECIAL)
    assert renderer.render_chat(messages) == want
    with pytest.raises(ChatTemplateError, match="nope"):
        renderer.render_chat(messages, chat_template="bad")
    with pytest.raises(ChatTemplateError, match="nope"):
        renderer.render_chat(messages, chat_template=bad + " ")  # a literal template, prepared on first use
    with pytest.raises(TypeError):  # a template kwarg naming a render argument: refused as before
        renderer.render_chat(messages, tools=None, **{"documents": []})


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_chat_sandboxs_fast_paths_render_as_the_plain_sandbox(name: str) -> None:
    """make_env's getattr shortcuts (a dict's keys, a loop's values) give what transformers' sandbox gives."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    ours = make_env()
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                          extensions=[type(e) for e in ours.extensions.values()])
    plain.filters["tojson"] = ours.filters["tojson"]
    plain.globals.update(ours.globals)
    fast, slow = ours.from_string(TEMPLATES[name]), plain.from_string(TEMPLATES[name])
    rng = random.Random(name + "sandbox")
    for messages in _steps(rng, 40):
        variables = _variables(rng, messages, rng.choice(["string", "openai"]))
        assert _outcome(lambda v=variables: fast.render(**v)) == _outcome(lambda v=variables: slow.render(**v))


def test_a_loops_private_parts_stay_out_of_reach() -> None:
    source = "{% for m in messages %}{{ loop._length }}|{{ loop.__class__ }}|{{ loop.cycle('a', 'b') }}{% endfor %}"
    text = make_env().from_string(source).render(messages=[1, 2])
    assert text == "||a||b"


def test_the_chat_sandbox_reads_a_dicts_keys_in_the_templates_own_code(qwen_tokenizer_dir: Path) -> None:
    """The inline ``obj.name`` read is in the generated code (not only the environment's getattr), and the
    Qwen template renders through it as through the plain sandbox, text and errors."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    ours = make_env()
    source = _qwen_template(qwen_tokenizer_dir)
    assert "t_ga" in str(ours.compile(source, raw=True))
    assert "t_ga" not in str(ours.compile("{{ m.items }}{{ m.get('a') }}", raw=True))  # dict's own attributes
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                          extensions=[type(e) for e in ours.extensions.values()])
    plain.filters["tojson"] = ours.filters["tojson"]
    plain.globals.update(ours.globals)
    fast, slow = PreparedTemplate(ours.from_string(source)), plain.from_string(source)
    rng = random.Random(9)
    for messages in _steps(rng, 150):
        variables = _variables(rng, messages, "string")
        variables["enable_thinking"] = rng.choice([True, False, None])
        assert _outcome(lambda v=variables: fast.render(v)) == _outcome(lambda v=variables: slow.render(**v))


def test_a_template_python_rejects_inlined_is_generated_as_jinja_generates_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import infera.kv.chat_template as ct

    def broken(self: Any, node: Any, frame: Any) -> None:
        self.write("(t_ga := ")  # unbalanced: a SyntaxError
        self.visit(node.node, frame)

    monkeypatch.setattr(ct._InlineGetattr, "visit_Getattr", broken)
    env = make_env()
    source = "{% for m in messages %}{{ m.role }}{% endfor %}"
    assert "t_ga" not in str(env.compile(source, raw=True))
    assert env.from_string(source).render(messages=[{"role": "user"}]) == "user"


def test_render_vars_renders_as_render_and_leaves_the_variables_as_given() -> None:
    template = make_env().from_string(TEMPLATES["attributes"])
    prepared = PreparedTemplate(template)
    rng = random.Random(11)
    for messages in _steps(rng, 40):
        variables = _variables(rng, messages, rng.choice(["string", "openai"]))
        before = dict(variables)
        assert _outcome(lambda v=variables: prepared.render_vars(v)) == _outcome(lambda v=variables: template.render(v))
        assert variables == before


def test_a_special_token_named_as_a_render_argument_is_refused_as_before() -> None:
    renderer = PromptRenderer(ByteCodec(BYTE_LEVEL_SPECIALS), {"default": CHATML_TEMPLATE}, {"messages": "x"})
    with pytest.raises(TypeError):
        renderer.render_chat([{"role": "user", "content": "hi"}])
