"""Chat templates rendered as transformers renders them, with vLLM's message parsing.

The Jinja environment mirrors the one transformers builds for chat templates; the
content-format detection and message normalisation follow vLLM's chat path (see
``infera.kv.tokenizer`` for the whole contract).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
import jinja2.utils
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment

ContentFormat = Literal["string", "openai"]

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
_MEDIA_PART_TYPES = {
    "image_url": "image", "input_image": "image", "image_pil": "image", "image_embeds": "image",
    "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio", "video_url": "video",
}
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
CHATML_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# ---------------------------------------------------------------------------------------
class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses it for masks)."""

    tags = {"generation"}  # noqa: RUF012 - jinja's own class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateDict:
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A jinja namespace that refuses underscore-prefixed names, as transformers' does."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's Namespace signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot store {name!r} on a namespace")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None,
    separators: tuple[str, str] | None = None, sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_DICT_ATTRS = frozenset(dir(dict))
# ``loop``'s public values: the sandbox finds each safe (no underscore, not internal, not a mutating method)
_LOOP_ATTRS = frozenset({"first", "last", "index", "index0", "revindex", "revindex0", "length", "depth", "depth0",
                         "previtem", "nextitem"})


class _InlineGetattr(CodeGenerator):
    """Jinja's code generator, with ``obj.name`` on a plain dict read in the template's own code.

    ``message.role`` compiles to ``environment.getattr(message, 'role')``: a Python call per
    attribute read (~18 per Qwen render). For a name that is not a ``dict`` attribute, the
    generated code here first reads the item itself when the object is exactly a ``dict``
    holding that key; anything else (another type, a missing key) calls
    ``environment.getattr`` as before. The value is what :meth:`_ChatTemplateEnv.getattr`
    returns for it, so the output is the same. ``t_ga`` is a local the generated function
    assigns (a walrus) right before reading it; a template whose code cannot hold it (a
    comprehension's iterable) is generated by jinja's own generator (see ``_generate``).
    """

    def visit_Getattr(self, node: jinja2.nodes.Getattr, frame: Frame) -> None:
        if self.environment.is_async or node.attr in _DICT_ATTRS:
            super().visit_Getattr(node, frame)
            return
        name = repr(node.attr)
        self.write("(t_ga[" + name + "] if type(t_ga := ")
        self.visit(node.node, frame)
        self.write(") is dict and " + name + " in t_ga else environment.getattr(t_ga, " + name + "))")


class _ChatTemplateEnv(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with fast paths for ``message.role`` on a plain dict and ``loop.first``.

    Jinja first tries ``getattr(message, "role")``, which for a dict raises (an exception a
    lookup, most of a template's time), then falls back to ``message["role"]``. A plain
    dict has exactly the attributes ``dir(dict)`` names, so any other name goes straight to
    the item lookup: the same value or the same undefined, without the exception. A jinja
    loop's public values (``_LOOP_ATTRS``) pass the sandbox's checks: read them directly.
    """

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if type(obj) is jinja2.runtime.LoopContext and attribute in _LOOP_ATTRS:
            return getattr(obj, attribute)
        return super().getattr(obj, attribute)

    def _generate(self, source: jinja2.nodes.Template, name: str | None, filename: str | None,
                  defer_init: bool = False) -> str:
        """The template's code from :class:`_InlineGetattr`, or jinja's own where Python rejects that one."""
        if not isinstance(source, jinja2.nodes.Template):
            return super()._generate(source, name, filename, defer_init)
        gen = _InlineGetattr(self, name, filename, None, defer_init, self.optimized)
        gen.visit(source)
        code: str = gen.stream.getvalue()  # type: ignore[attr-defined]
        try:
            compile(code, filename or "<template>", "exec")
        except SyntaxError:
            return super()._generate(source, name, filename, defer_init)
        return code


def make_env() -> ImmutableSandboxedEnvironment:
    env = _ChatTemplateEnv(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


# ---------------------------------------------------------------------------------------
# Rendering with the per-render set-up done once


class PreparedTemplate:
    """A compiled template rendered exactly as ``Template.render`` renders it, for less per render.

    ``Template.render`` builds its context from scratch each time: it copies the template's
    globals out of a ``ChainMap`` (environment globals under template globals), then lists
    their keys again for the context (~6 µs of a ~23 µs chat render). Here they are
    flattened once (``globals``; the environment is complete before templates are compiled,
    so nothing changes them later) and each render's context is made directly
    (:meth:`new_context`): the same parent mapping (the globals overridden by the
    variables), the same fields, so the same output and the same errors, raised through the
    environment's ``handle_exception`` as ``render`` raises them.
    """

    __slots__ = ("_blocks", "_concat", "_env", "_keys", "_name", "_plain", "_run", "globals", "template")

    def __init__(self, template: jinja2.Template) -> None:
        self.template = template
        env = template.environment
        self._env = env
        self.globals: dict[str, Any] = dict(template.globals)
        self._keys = frozenset(self.globals)
        self._name = template.name
        self._blocks = template.blocks
        self._run = template.root_render_func
        self._concat = env.concat
        # a subclassed context or async rendering: build the context as jinja does
        self._plain = env.context_class is jinja2.runtime.Context and not env.is_async

    def new_context(self, variables: dict[str, Any]) -> jinja2.runtime.Context:
        """``template.new_context(variables)``: the globals overridden by ``variables`` (not kept)."""
        if not self._plain:
            return self.template.new_context(variables)
        ctx: jinja2.runtime.Context = object.__new__(jinja2.runtime.Context)
        ctx.parent = {**self.globals, **variables}
        ctx.vars = {}
        ctx.environment = self._env
        ctx.eval_ctx = jinja2.nodes.EvalContext(self._env, self._name)
        ctx.exported_vars = set()
        ctx.name = self._name
        ctx.globals_keys = set(self._keys)
        ctx.blocks = {k: [v] for k, v in self._blocks.items()} if self._blocks else {}
        return ctx

    def render(self, *args: Any, **kwargs: Any) -> str:
        """``template.render(*args, **kwargs)``: the same text, the same exceptions."""
        if not self._plain:
            return self.template.render(*args, **kwargs)
        return self.render_vars(dict(*args, **kwargs))

    def render_vars(self, variables: dict[str, Any]) -> str:
        """``template.render(variables)`` (``variables`` is read, not kept): :meth:`render` without copying the
        caller's dict of variables again."""
        if not self._plain:
            return self.template.render(variables)
        ctx = self.new_context(variables)
        try:
            out: str = self._concat(self._run(ctx))
        except Exception:
            self._env.handle_exception()
        return out


# ---------------------------------------------------------------------------------------
# Content format detection (vLLM's rule: does the template loop over message content?)


def _is_access(node: jinja2.nodes.Node, var: str, key: str | None = None) -> bool:
    """``var`` (or ``var.key`` / ``var['key']``), possibly behind a filter, test or slice."""
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return node.node is not None and _is_access(node.node, var, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_access(node.node, var, key)
    if key is None:
        return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == var
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_access(node.node, var) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_access(node.node, var) and node.attr == key
    return False


def _aliases(root: jinja2.nodes.Template, var: str) -> Iterator[str]:
    """``var`` and every name assigned from it (``{% set msgs = messages[1:] %}``), transitively."""
    seen = {var}
    todo = deque([var])
    yield var
    while todo:
        current = todo.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if isinstance(assign.target, jinja2.nodes.Name) and _is_access(assign.node, current):
                name = assign.target.name
                if name not in seen:
                    seen.add(name)
                    todo.append(name)
                    yield name


def _loop_targets(root: jinja2.nodes.Template, iter_vars: Sequence[str], key: str | None) -> list[str]:
    names: list[str] = []
    for loop in root.find_all(jinja2.nodes.For):
        if isinstance(loop.target, jinja2.nodes.Name) and any(_is_access(loop.iter, v, key) for v in iter_vars):
            names.append(loop.target.name)
    return names


def detect_content_format(env: jinja2.Environment, template: str) -> ContentFormat:
    """"openai" when the template iterates over a message's content, else "string" (vLLM's rule)."""
    try:
        root = env.parse(template)
        message_vars = _loop_targets(root, list(_aliases(root, "messages")), None)
        return "openai" if _loop_targets(root, message_vars, "content") else "string"
    except jinja2.TemplateError:
        return "string"


# ---------------------------------------------------------------------------------------
# Message normalisation


def _parts_to_content(content: Any, fmt: ContentFormat) -> Any:
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [content]
    else:
        parts = list(content)
    texts: list[str] = []
    wrapped: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, str):
            text: str | None = part
            media = None
        else:
            kind = part.get("type")
            text = part.get("text") if kind in _TEXT_PART_TYPES or (kind is None and "text" in part) else None
            media = _MEDIA_PART_TYPES.get(kind) if text is None else None
            if text is None and media is None:
                continue
        if text is not None:
            texts.append(text)
            wrapped.append({"type": "text", "text": text})
        elif media is not None:
            wrapped.append({"type": media})
    return "\n".join(texts) if fmt == "string" else wrapped


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for item in raw:
        call = dict(item)
        function = call.get("function")
        if isinstance(function, dict):
            function = dict(function)
            args = function.get("arguments")
            if not args:
                function["arguments"] = {}
            elif not isinstance(args, dict | list):
                function["arguments"] = json.loads(args)
            call["function"] = function
        calls.append(call)
    return calls


def normalize_messages(messages: Sequence[dict[str, Any]], fmt: ContentFormat) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to ``apply_chat_template``, then as transformers passes them on.

    Pure: the caller's dicts are not modified.
    """
    out: list[dict[str, Any]] = []
    plain = fmt == "string"
    for message in messages:
        role = message["role"]
        if plain and len(message) == 2 and role is not None and type(message.get("content")) is str:
            out.append({"role": role, "content": message["content"]})  # what the steps below give it
            continue
        msg: dict[str, Any] = {"role": role, "content": _parts_to_content(message.get("content"), fmt)}
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls:
                msg["tool_calls"] = _tool_calls(calls)
            reasoning = message.get("reasoning")
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            msg["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            msg["name"] = message["name"]
        # transformers: drop None values, alias reasoning under the names templates read
        msg = {k: v for k, v in msg.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out
