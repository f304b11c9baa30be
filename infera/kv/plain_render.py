"""Short chats of plain messages rendered from a recipe: the template's own text with the contents put in.

A request of a few ``{"role": str, "content": str}`` messages (most chat traffic: a system prompt,
some history, the user's turn) renders to constant text around the messages' contents, the same
for every request whose roles are the same. :class:`PlainRecipes` renders such a *shape* once
through jinja with stand-in contents, keeps where each content lands (the **recipe**: constant
pieces and content indices), and renders later requests of that shape as one ``str.join``: no
jinja frames, no context, no loop object (~1-2 µs instead of ~8 for a 4-message Qwen chat).

Why the recipe gives the template's text, from the template's AST (:func:`plain_safe`, checked
once at load; a template that fails any check gets no recipe and is rendered as before):

* a message is read only as ``message.<key>`` / ``message['<key>']``, where ``message`` is the
  target of a ``{% for message in messages %}`` or ``messages[<index>]`` (the index not reading a
  content); ``messages`` otherwise only as ``messages|length`` or a truth value. No message is
  used whole (``message|tojson``, ``loop.nextitem``, ``messages[1:]``, an alias by ``set``).
* a message's ``content`` is read only where its value reaches the output *verbatim*: an output
  expression, an operand of ``+`` built of string constants, message reads and contents only (no
  operand that could be a ``Markup``, whose ``__radd__`` would escape), of ``~``, the branches of
  ``if``-expressions and of ``and``/``or`` in those places; or where only its *truth* is read
  (``{% if message.content %}``, ``not``, a test of an ``if``-expression). Never in a filter, a
  test, a comparison, a call, a subscript, an assignment, a loop's iterable.
* nothing captures output (``{% set %}`` blocks, macros, call and filter blocks, includes,
  imports, scopes) and nothing impure runs (``strftime_now``, ``lipsum``, ``cycler``, ``joiner``,
  ``random``).

So the template's control flow and every value other than the contents are functions of the
render variables, the roles, the number of messages and which contents are empty, and each
content reaches the output unchanged wherever it does. The key is exactly those (the variables
are fixed: no ``tools``, no template kwargs, ``add_generation_prompt`` a bool in the key); a
stand-in render with distinct markers in place of the non-empty contents shows where each one
lands. A second stand-in render with other markers must give the same recipe (a marker that
some constant happened to contain would not); a template error on a shape is remembered as no
recipe, and such requests render whole, raising as before.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jinja2
import jinja2.nodes as nodes

MAX_MESSAGES = 11  # longer chats go to the render cache (infera.kv.render_cache: per message, from 12)
MAX_SHAPES = 4096  # recipes kept (oldest first out); a key is a few short strings
_IMPURE_NAMES = frozenset({"strftime_now", "lipsum", "cycler", "joiner"})
_IMPURE_FILTERS = frozenset({"random"})
_CAPTURING = (
    nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock, nodes.Import, nodes.FromImport,
    nodes.Include, nodes.Extends, nodes.Block, nodes.Scope, nodes.OverlayScope, nodes.EvalContextModifier,
    nodes.ScopedEvalContextModifier, nodes.ExtensionAttribute, nodes.ImportedName, nodes.InternalName,
    nodes.ContextReference, nodes.DerivedContextReference, nodes.With,
)
_WHOLE_ITEM = frozenset({"previtem", "nextitem"})  # ``loop`` values that are a whole message
# where an expression stands: its value unused but for side effects, written out as is, only its truth read
_NONE, _VERBATIM, _TRUTH = 0, 1, 2

Recipe = tuple[str | int, ...]  # constant text, or the index of the message whose content goes there


class _Proof:
    """:func:`plain_safe`'s walk over one template's AST."""

    def __init__(self, targets: frozenset[str]) -> None:
        self.targets = targets  # names a loop over ``messages`` binds: a message

    def _message(self, node: nodes.Node) -> bool:
        """``node`` is a message: a loop target, or ``messages[i]`` (``i`` checked)."""
        if isinstance(node, nodes.Name):
            return node.ctx == "load" and node.name in self.targets
        if isinstance(node, nodes.Getitem) and isinstance(node.node, nodes.Name) and node.node.name == "messages":
            return not isinstance(node.arg, nodes.Slice) and self.expr(node.arg, _NONE)
        return False

    def _read(self, node: nodes.Node) -> str | None:
        """The key of a message read (``message.key``, ``message['key']``), else None."""
        if isinstance(node, nodes.Getattr) and self._message(node.node):
            return node.attr
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str) \
                and self._message(node.node):
            return node.arg.value
        return None

    def _stringy(self, node: nodes.Node) -> bool:
        """An operand ``+`` may join a content with: a str constant, a message read, or built of those alone."""
        if isinstance(node, nodes.Const):
            return isinstance(node.value, str)
        if self._read(node) is not None:
            return True
        if isinstance(node, nodes.Add):
            return self._stringy(node.left) and self._stringy(node.right)
        if isinstance(node, nodes.Concat):
            return all(self.expr(n, _VERBATIM) for n in node.nodes)
        if isinstance(node, nodes.CondExpr):
            return self.expr(node.test, _TRUTH) and self._stringy(node.expr1) \
                and (node.expr2 is None or self._stringy(node.expr2))
        if isinstance(node, nodes.And | nodes.Or):
            return self._stringy(node.left) and self._stringy(node.right)
        return False

    def _has_content(self, node: nodes.Node) -> bool:
        return self._read(node) == "content" or any(self._has_content(c) for c in node.iter_child_nodes())

    def expr(self, node: nodes.Node, where: int) -> bool:
        key = self._read(node)
        if key is not None:
            return key != "content" or where != _NONE
        if isinstance(node, nodes.Name):
            if node.name == "messages":
                return where == _TRUTH  # ``{% if messages %}``; its length through ``|length`` below
            return node.name not in self.targets and not (node.ctx == "load" and node.name in _IMPURE_NAMES)
        if isinstance(node, nodes.Getitem) and isinstance(node.node, nodes.Name) and node.node.name == "messages":
            return False  # a message not read by key (a slice, a whole message)
        if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop" \
                and node.attr in _WHOLE_ITEM:
            return False
        if isinstance(node, nodes.Test) and node.name in ("defined", "undefined") and not node.args \
                and not node.kwargs and node.dyn_args is None and node.dyn_kwargs is None \
                and self._message(node.node):
            return True  # ``messages[i] is defined``: whether ``i`` is in range, a function of the length
        if isinstance(node, nodes.Filter):
            if node.name in _IMPURE_FILTERS:
                return False
            if node.name == "length" and isinstance(node.node, nodes.Name) and node.node.name == "messages" \
                    and not node.args and not node.kwargs and node.dyn_args is None and node.dyn_kwargs is None:
                return True
        if isinstance(node, nodes.Add) and where == _VERBATIM and self._has_content(node):
            return self._stringy(node)
        if isinstance(node, nodes.Concat) and where == _VERBATIM:
            return all(self.expr(n, _VERBATIM) for n in node.nodes)
        if isinstance(node, nodes.CondExpr):
            return self.expr(node.test, _TRUTH) and self.expr(node.expr1, where) \
                and (node.expr2 is None or self.expr(node.expr2, where))
        if isinstance(node, nodes.And | nodes.Or):  # the value is an operand's, chosen by its truth
            return self.expr(node.left, where) and self.expr(node.right, where)
        if isinstance(node, nodes.Not):
            return self.expr(node.node, _TRUTH)
        return all(self.expr(c, _NONE) for c in node.iter_child_nodes())

    def stmt(self, node: nodes.Node) -> bool:
        if isinstance(node, nodes.Output):
            return all(self.expr(n, _VERBATIM) for n in node.nodes)
        if isinstance(node, nodes.If):
            return self.expr(node.test, _TRUTH) and all(self.stmt(n) for n in node.body) \
                and all(self.stmt(n) for n in node.elif_) and all(self.stmt(n) for n in node.else_)
        if isinstance(node, nodes.For):
            over_messages = isinstance(node.iter, nodes.Name) and node.iter.name == "messages"
            return (over_messages or self.expr(node.iter, _NONE)) \
                and (node.test is None or self.expr(node.test, _TRUTH)) \
                and all(self.stmt(n) for n in [*node.body, *node.else_])
        if isinstance(node, nodes.Expr):
            return self.expr(node, _NONE)
        if isinstance(node, nodes.Assign):  # its target: a name or ``ns.attr`` (checked in plain_safe)
            return self.expr(node.node, _NONE)
        return isinstance(node, nodes.Break | nodes.Continue | nodes.ExprStmt) and \
            all(self.expr(c, _NONE) for c in node.iter_child_nodes())


def plain_safe(root: nodes.Template) -> bool:
    """Whether ``root`` renders plain messages as constant text around their contents (the module doc)."""
    targets: set[str] = set()
    for node in root.find_all(nodes.Node):
        if isinstance(node, _CAPTURING):
            return False
        if isinstance(node, nodes.Name) and node.name == "messages" and node.ctx != "load":
            return False
        if isinstance(node, nodes.For) and isinstance(node.iter, nodes.Name) and node.iter.name == "messages":
            if not isinstance(node.target, nodes.Name) or node.recursive:
                return False
            targets.add(node.target.name)
    # a message's name bound to anything else (another loop's target, a ``set``) would not be a message there
    for node in root.find_all(nodes.Name):
        if node.ctx != "load" and node.name in targets:
            owner = next((f for f in root.find_all(nodes.For) if f.target is node), None)
            if owner is None or not (isinstance(owner.iter, nodes.Name) and owner.iter.name == "messages"):
                return False
    proof = _Proof(frozenset(targets))
    return all(proof.stmt(n) for n in root.body)


class PlainRecipes:
    """Recipes of one template proven :func:`plain_safe`, learnt per shape (thread-safe)."""

    def __init__(self, render: Callable[[dict[str, Any]], str], variables: dict[str, Any]) -> None:
        self._render = render  # the template's whole render of a dict of variables
        self._variables = variables  # every variable but ``messages`` and ``add_generation_prompt``
        self._recipes: dict[tuple[Any, ...], Recipe | None] = {}
        self._lock = threading.Lock()
        self.max_messages = MAX_MESSAGES
        self.learnt = 0  # shapes rendered with stand-ins

    @classmethod
    def build(cls, env: jinja2.Environment, source: str, render: Callable[[dict[str, Any]], str],
              variables: dict[str, Any]) -> PlainRecipes | None:
        """Recipes for ``source`` (rendered by ``render`` with ``variables`` and the messages), or None when the
        template is not proven :func:`plain_safe`."""
        try:
            return cls(render, variables) if plain_safe(env.parse(source)) else None
        except jinja2.TemplateError:
            return None

    def render(self, messages: Sequence[Any], add_generation_prompt: bool) -> str | None:
        """The template's text for ``messages``, or None (nothing done) when they are not all plain, there are
        too many, or the shape's stand-in render raised: render them whole."""
        n = len(messages)
        if not 0 < n <= self.max_messages or type(add_generation_prompt) is not bool:
            return None
        contents: list[str] = []
        key: list[Any] = [add_generation_prompt]
        for m in messages:
            if type(m) is not dict or len(m) != 2:
                return None
            role = m.get("role")
            content = m.get("content")
            if type(role) is not str or type(content) is not str:
                return None
            contents.append(content)
            key.append(role)
            key.append(not content)
        shape = tuple(key)
        try:
            recipe = self._recipes[shape]
        except KeyError:
            recipe = self._learn(shape)
        if recipe is None:
            return None
        return "".join([p if type(p) is str else contents[p] for p in recipe])  # type: ignore[index]

    def prime(self) -> int:
        """Learn the shapes of common chats now (a server's start), not on their first requests: a system message
        or none, then user and assistant turns alternating up to a user's, no content empty,
        ``add_generation_prompt`` True, up to ``max_messages``. Each is the recipe such a request would learn (the
        same stand-in renders); a request's learning costs ~0.7 ms of jinja a shape (bench/README.md, "Issue 15,
        seventeenth round ... ctx19"). Returns how many shapes were learnt here."""
        before = self.learnt
        for lead in ((), ("system",)):
            for n in range(len(lead) + 1, self.max_messages + 1, 2):
                key: list[Any] = [True]
                for i in range(n):
                    key.append(lead[i] if i < len(lead) else "user" if (i - len(lead)) % 2 == 0 else "assistant")
                    key.append(False)
                shape = tuple(key)
                if shape not in self._recipes:
                    self._learn(shape)
        return self.learnt - before

    def _learn(self, shape: tuple[Any, ...]) -> Recipe | None:
        """The recipe of ``shape`` ((add_generation_prompt, role, empty, role, empty, ...)), kept."""
        recipe = self._stand_in(shape)
        if recipe is not None and self._stand_in(shape) != recipe:
            recipe = None  # a marker found where no content is: not a recipe (module doc)
        with self._lock:
            if len(self._recipes) >= MAX_SHAPES:
                del self._recipes[next(iter(self._recipes))]
            self._recipes[shape] = recipe
            self.learnt += 1
        return recipe

    def _stand_in(self, shape: tuple[Any, ...]) -> Recipe | None:
        nonce = secrets.token_hex(16)
        messages = [{"role": shape[1 + 2 * i], "content": "" if shape[2 + 2 * i] else f"\ue000{nonce}:{i}\ue001"}
                    for i in range((len(shape) - 1) // 2)]
        try:
            text = self._render({**self._variables, "messages": messages, "add_generation_prompt": shape[0]})
        except Exception:
            return None  # the whole render raises it as before
        parts = re.split(f"\ue000{nonce}:(\\d+)\ue001", text)
        return tuple(int(p) if i % 2 else p for i, p in enumerate(parts) if i % 2 or p)
