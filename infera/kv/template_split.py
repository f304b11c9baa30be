"""Chat templates proven to be *header, one loop over the messages, footer*: see ``infera.kv.render_cache``.

:func:`split_template` checks a template's AST and compiles the frame, body and marked templates
the render cache renders with.

Why a body renders the same alone, the conditions checked on the AST (else: no split, the
template is rendered whole as before):

* exactly one ``{% for x in messages %}`` (no ``if`` filter, ``else``, ``recursive``), a direct
  child of the template; ``messages`` is never assigned anywhere;
* the body assigns nothing in its own scope (``set`` only inside a nested ``for``), has no
  ``break``/``continue`` of its own, no macro, call block, include, import, ``namespace``
  attribute store or scope node, and reads no name the template assigns outside the loop
  (those could carry state between iterations); no ``strftime_now``, ``lipsum``,
  ``cycler``, ``joiner`` or ``random`` (not functions of the input);
* the loop's own ``loop`` is read only as ``loop.first|last|index|index0|length|revindex|
  revindex0`` (plain values the stand-in gives alike); ``messages`` only as ``messages[i]``
  with a single index.
"""

from __future__ import annotations

import jinja2
import jinja2.nodes as nodes

LOOP_ATTRS = frozenset({"first", "last", "index", "index0", "length", "revindex", "revindex0"})
_LENGTH_ATTRS = frozenset({"length", "revindex", "revindex0"})
_IMPURE_NAMES = frozenset({"strftime_now", "lipsum", "cycler", "joiner"})
_IMPURE_FILTERS = frozenset({"random"})
_SCOPED = (
    nodes.Macro, nodes.CallBlock, nodes.Import, nodes.FromImport, nodes.Include, nodes.Extends, nodes.Block,
    nodes.Scope, nodes.OverlayScope, nodes.ScopedEvalContextModifier, nodes.EvalContextModifier, nodes.NSRef,
    nodes.FilterBlock, nodes.With, nodes.ExtensionAttribute, nodes.ImportedName, nodes.InternalName,
    nodes.ContextReference, nodes.DerivedContextReference,
)
BODY_VAR = "infera_rendered_messages"
BODY_MARK = "infera_body_mark"
END_MARK = "infera_loop_end"


class SplitTemplate:
    """A template proven to be frame + one body per message (see the module doc)."""

    __slots__ = ("body", "frame", "globals", "marked", "names", "reads_last", "reads_length", "target")

    def __init__(self, frame: jinja2.Template, body: jinja2.Template, marked: jinja2.Template, target: str,
                 names: frozenset[str], loop_attrs: frozenset[str]) -> None:
        self.frame = frame
        self.body = body
        self.marked = marked  # the whole template, each body's output led by _BODY, the loop's followed by _END
        self.target = target  # the loop variable's name
        self.names = names  # every name the body loads: the render variables it may read
        # what a body may read of ``loop`` (a marked render cannot record it: jinja's own loop object)
        self.reads_last = "last" in loop_attrs
        self.reads_length = not _LENGTH_ATTRS.isdisjoint(loop_attrs)
        # the environment's globals as ``Template.render`` merges them, once (a ChainMap copied per render
        # costs more than a short body); the environment is complete before templates are compiled
        self.globals = dict(body.globals)


def split_template(env: jinja2.Environment, source: str) -> SplitTemplate | None:
    """The frame and body templates of ``source``, or None when its shape is not proven."""
    try:
        root = env.parse(source)
        loop = _messages_loop(root)
        if loop is None or not isinstance(loop.target, nodes.Name):
            return None
        inside = {id(n) for child in loop.body for n in child.find_all(nodes.Name)}
        stored_outside = {n.name for n in root.find_all(nodes.Name)
                          if n.ctx != "load" and id(n) not in inside and n is not loop.target}
        if any(n.name == "messages" and n.ctx != "load" for n in root.find_all(nodes.Name)):
            return None
        if any(isinstance(n, _SCOPED) for n in root.find_all(nodes.Node)):
            return None  # macros, imports, namespace stores, scopes: anywhere, not only in the body
        check = _BodyCheck(stored_outside)
        if not all(check.ok(child, 0) for child in loop.body):
            return None
        target = loop.target.name
        names = frozenset(n.name for child in loop.body for n in child.find_all(nodes.Name)
                          if n.ctx == "load") - {"loop", "messages", target}
        body_root = nodes.Template(list(loop.body), lineno=1)
        body_root.set_environment(env)
        frame_root = env.parse(source)  # a fresh tree: the body keeps the first one's nodes
        frame_loop = _messages_loop(frame_root)
        assert frame_loop is not None
        at = next(i for i, n in enumerate(frame_root.body) if n is frame_loop)
        frame_root.body[at] = nodes.Output([nodes.Name(BODY_VAR, "load", lineno=frame_loop.lineno)],
                                           lineno=frame_loop.lineno)
        frame_root.set_environment(env)
        marked_root = env.parse(source)
        marked_loop = _messages_loop(marked_root)
        assert marked_loop is not None
        marked_loop.body.insert(0, nodes.Output([nodes.Name(BODY_MARK, "load", lineno=marked_loop.lineno)],
                                                lineno=marked_loop.lineno))
        at = next(i for i, n in enumerate(marked_root.body) if n is marked_loop)
        marked_root.body.insert(at + 1, nodes.Output([nodes.Name(END_MARK, "load", lineno=marked_loop.lineno)],
                                                     lineno=marked_loop.lineno))
        marked_root.set_environment(env)
        if any(n.name in (BODY_VAR, BODY_MARK, END_MARK) for n in root.find_all(nodes.Name)):
            return None
        loop_attrs = frozenset(n.attr for child in loop.body for n in child.find_all(nodes.Getattr)
                               if isinstance(n.node, nodes.Name) and n.node.name == "loop")
        return SplitTemplate(env.from_string(frame_root), env.from_string(body_root), env.from_string(marked_root),
                             target, names, loop_attrs)
    except jinja2.TemplateError:
        return None


def _messages_loop(root: nodes.Template) -> nodes.For | None:
    """The template's one loop over ``messages``, when it is a plain loop at the top level."""
    loops = [f for f in root.find_all(nodes.For) if isinstance(f.iter, nodes.Name) and f.iter.name == "messages"]
    if len(loops) != 1:
        return None
    loop = loops[0]
    if loop.recursive or loop.else_ or loop.test is not None or not any(n is loop for n in root.body):
        return None
    return loop


class _BodyCheck:
    """Whether a node of the loop body renders alone as it does in the loop (module doc)."""

    def __init__(self, stored_outside: set[str]) -> None:
        self.stored_outside = stored_outside

    def ok(self, node: nodes.Node, depth: int) -> bool:
        """``depth`` 0: the loop's own scope; > 0: inside a nested ``for`` (its own ``loop``, its own ``set``)."""
        if depth == 0 and isinstance(node, nodes.Assign | nodes.AssignBlock | nodes.Break | nodes.Continue):
            return False
        if isinstance(node, nodes.For):
            if node.recursive or node.else_ or node.test is not None:
                return False
            return self.ok(node.iter, depth) and all(self.ok(n, depth + 1) for n in [node.target, *node.body])
        if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop" \
                and depth == 0:
            return node.attr in LOOP_ATTRS
        if isinstance(node, nodes.Getitem) and isinstance(node.node, nodes.Name) and node.node.name == "messages":
            return not isinstance(node.arg, nodes.Slice) and self.ok(node.arg, depth)
        if isinstance(node, nodes.Name):
            if node.name == "messages" or (node.name == "loop" and depth == 0):
                return False  # only ``messages[i]`` and ``loop.<attr>``
            return node.ctx != "load" or (node.name not in self.stored_outside and node.name not in _IMPURE_NAMES)
        if isinstance(node, nodes.Filter) and node.name in _IMPURE_FILTERS:
            return False
        return all(self.ok(child, depth) for child in node.iter_child_nodes())
