"""Chat-template renders reused message by message: a conversation's next turn renders its new messages.

Jinja renders the whole conversation on every request (~1.4 µs a message here, 60 % of the
prompt stage at 16k tokens). Most chat templates are *header, one loop over ``messages``,
footer*; :func:`split_template` proves that shape from the template's AST at load time and
compiles three templates from it: the **frame** (the template with the loop replaced by one
variable, the loop's whole output), the **body** (the loop's body alone, rendered once per
message with that message, a stand-in for ``loop`` and ``messages``) and the **marked** copy
(the template itself with a mark output before each body and after the loop). The loop's output
is the concatenation of its bodies, so ``frame(bodies joined) == template`` whenever each body
renders as it does inside the loop; the marked copy renders the template's own text, and the
marks (yielded as themselves, before the body's code runs) say where each body starts.

A request that can reuse over half of its bodies, and at least ``BODIES_MIN``, renders the others
alone and the frame; any other (a new conversation, an edited one) is one marked render, about a
whole render's cost, whose bodies are kept for the next turn. Under ``MIN_MESSAGES`` messages
the template is rendered whole and nothing is kept.

A body renders alone as it does in the loop when the template passes the checks
``infera.kv.template_split`` makes on its AST (else: no split, the template is rendered whole).

A body's output is then a function of what it reads: its message, the ``loop`` values, the
messages it subscripts, and the render's variables. What it read is recorded while it renders
(:class:`_Reads`; in a marked render its ``loop`` reads are taken from the AST, jinja's own loop
object being in use), and a later request reuses the body only where all of that is the same:
the messages it read lie in the prefix both requests share (compared strictly: a ``1`` is not
a ``1.0`` nor a ``True``, key order counts), the same side of ``loop.last``, the same length
if it read one, the same values of the variables the body names. A template error on this
path falls back to the whole render, so errors read as before.

A conversation keeps one entry (a request that extends one drops it), least recently used
first out past ``max_bytes`` (the bodies' text, ~2 bytes a character counted, plus 100 a
message).
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from infera.kv.chat_template import ContentFormat, normalize_messages
from infera.kv.template_split import BODY_MARK, BODY_VAR, END_MARK, SplitTemplate

_RESERVED = frozenset({"messages", BODY_VAR, BODY_MARK, END_MARK})
DEFAULT_MAX_BYTES = 32 << 20
MIN_MESSAGES = 12  # fewer: rendered whole, not kept (bookkeeping ~1 µs a message would not pay back)
BODIES_MIN = 8  # bodies reused below which a render is one marked whole render (about a whole render's cost)
TAIL_PROBES = 4  # prefix lengths looked up, from the request's own length down


# ---------------------------------------------------------------------------------------
# What a body reads while it renders


class _Untracked(Exception):  # a signal, not an error the caller sees
    """A body subscripted ``messages`` with something other than an int: render the whole template."""


class _Reads:
    __slots__ = ("high", "last", "length", "unstable")

    def __init__(self) -> None:
        self.high = -1  # the highest message index read through ``messages[i]``
        self.unstable = False  # a negative or out-of-range index: depends on the length
        self.last = False
        self.length = False


class _MessageView(list[Any]):
    """``messages`` for a body: the same items; records each ``messages[i]`` in the current ``_Reads``."""

    __slots__ = ("_reads",)
    _reads: _Reads

    def __getitem__(self, key: Any) -> Any:
        if type(key) is not int and type(key) is not bool:
            if isinstance(key, str):  # jinja would look for an attribute of that name: this class has one more
                raise _Untracked
            self._reads.unstable = True  # a slice (the frame's code): depends on the length
            return list.__getitem__(self, key)
        reads: _Reads = self._reads
        n = len(self)
        i = key + n if key < 0 else int(key)
        if key < 0 or i >= n:
            reads.unstable = True
        elif i > reads.high:
            reads.high = i
        return list.__getitem__(self, key)


class _Mark(str):
    """An output jinja passes through as itself (``str(mark) is mark``): where a body starts, where the loop ends."""

    __slots__ = ()

    def __str__(self) -> str:
        return self


_BODY = _Mark()
_END = _Mark()


class _Loop:
    """The loop values a body may read (LOOP_ATTRS), equal to jinja's ``LoopContext``'s; reads recorded."""

    __slots__ = ("_i", "_n", "_reads")

    def __init__(self, i: int, n: int, reads: _Reads) -> None:
        self._i, self._n, self._reads = i, n, reads

    @property
    def first(self) -> bool:
        return self._i == 0

    @property
    def last(self) -> bool:
        self._reads.last = True
        return self._i == self._n - 1

    @property
    def index0(self) -> int:
        return self._i

    @property
    def index(self) -> int:
        return self._i + 1

    @property
    def length(self) -> int:
        self._reads.length = True
        return self._n

    @property
    def revindex(self) -> int:
        self._reads.length = True
        return self._n - self._i

    @property
    def revindex0(self) -> int:
        self._reads.length = True
        return self._n - self._i - 1


# ---------------------------------------------------------------------------------------
# Messages compared strictly


def _frozen(x: Any) -> Any:
    """``x`` as a hashable value equal only to what renders the same (type and key order count)."""
    t = type(x)
    if t is str:
        return x
    if t is dict:
        return ("d", tuple((k if type(k) is str else _frozen(k), _frozen(v)) for k, v in x.items()))
    if t is list or t is tuple:
        return ("l" if t is list else "t", tuple(map(_frozen, x)))
    if x is None or t is bool or t is int:
        return (t.__name__, x)
    if t is float:
        return ("f", x.hex())
    if x is _MISSING:
        return x
    return ("o", object())  # anything else: never equal, never reused


class _Strict:
    """Stands in a stored message that is not ``{"role": str, "content": str}``: equal to a dict only strictly."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return type(other) is dict and _frozen(other) == self.key

    def __hash__(self) -> int:
        return hash(self.key)


def _plain(m: Any) -> bool:
    return type(m) is dict and len(m) == 2 and type(m.get("role")) is str and type(m.get("content")) is str


def _hkey(m: dict[str, Any]) -> int:
    """A hash of the message, for finding candidates (equality is checked after)."""
    if _plain(m):
        return hash((m["role"], m["content"]))
    return hash(_frozen(m))


_NEVER = 1 << 62  # a body's need that no request meets


def _need(i: int, n: int, r: _Reads) -> int:
    """How long a prefix a later request must share for body ``i`` of an ``n``-message render to be reused.

    Its message and those it read must be in the prefix (the longest index + 1); a body that read
    the length, or read ``loop.last`` as the last message, is not reused (a later request is longer).
    A later request that *is* that prefix is handled by :meth:`RenderCache._render` (``loop.last``).
    """
    if r.unstable or r.length or (r.last and i == n - 1):
        return _NEVER
    return max(i, r.high) + 1


class _Entry:
    __slots__ = ("bodies", "cmp", "last", "need", "norm", "reach", "size", "slots", "values")

    def __init__(self, cmp: list[Any], norm: list[dict[str, Any]], bodies: list[str], need: list[int],
                 reach: list[int], last: list[bool], values: tuple[Any, ...], chars: int) -> None:
        # ``cmp[i] == message`` exactly when ``message`` renders as this entry's message i: a plain message's
        # normalised dict (equal to its raw dict: str values compare strictly), else a _Strict
        self.cmp = cmp
        self.norm = norm
        self.bodies = bodies
        self.need = need  # per body: _need
        self.reach = reach  # running max of ``need``: bodies [0, p) are reusable when reach[p - 1] <= prefix
        self.last = last  # per body: it read ``loop.last``
        self.values = values  # the render variables the body names, frozen
        self.slots: list[tuple[int, int]] = []  # its keys in the cache's index
        self.size = 100 * len(bodies) + 2 * chars


class RenderCache:
    """Renders of one split template, reused per message across requests (thread-safe)."""

    def __init__(self, split: SplitTemplate, fmt: ContentFormat, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.split = split
        self.fmt = fmt
        self.max_bytes = max_bytes
        self.min_messages = MIN_MESSAGES
        self.bodies_min = BODIES_MIN
        self._names = tuple(sorted(split.names))
        self._marks = {BODY_MARK: _BODY, END_MARK: _END}
        self._keys: dict[tuple[int, int], _Entry] = {}
        self._lru: OrderedDict[int, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0  # renders that reused at least one body
        self.reused = 0  # bodies reused
        self.rendered = 0  # bodies rendered

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def entries(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()
            self._lru.clear()
            self._bytes = 0

    def render(self, messages: Sequence[Any], variables: Mapping[str, Any]) -> str | None:
        """The template's output for ``messages`` and the render ``variables`` (all but ``messages``), or None
        when this path does not apply (too few messages, a name it reserves, any error): render it whole."""
        n = len(messages)
        if n < self.min_messages or not _RESERVED.isdisjoint(variables):
            return None
        try:
            values = tuple([_frozen(variables.get(name, _MISSING)) for name in self._names]) if self._names else ()
            with self._lock:
                base, k = self._find(messages, values)
                if base is not None:
                    self._lru.move_to_end(id(base))
            return self._render(messages, variables, values, base, k)
        except _Untracked:
            return None
        except Exception:  # a template error: the whole render raises it as the engine would
            return None

    # -- internals -----------------------------------------------------------------------

    def _find(self, messages: Sequence[Any], values: tuple[Any, ...]) -> tuple[_Entry | None, int]:
        """The entry sharing the longest probed prefix with ``messages``, and that prefix's length."""
        n = len(messages)
        keys = self._keys
        for k in range(n, max(0, n - TAIL_PROBES), -1):
            entry = keys.get((k, _hkey(messages[k - 1])))
            if entry is not None and entry.values == values and entry.cmp[:k] == messages[:k]:
                return entry, k
        return None, 0

    def _render(self, messages: Sequence[Any], variables: Mapping[str, Any], values: tuple[Any, ...],
                base: _Entry | None, k: int) -> str:
        n = len(messages)
        split = self.split
        bodies: list[str]
        need: list[int]
        reach: list[int]
        last: list[bool]
        if base is not None:
            norm = base.norm[:k] + normalize_messages(messages[k:], self.fmt)
            # a request that is exactly the prefix: its last body is the last now (it may read loop.last)
            usable = k - 1 if k == n and base.last[k - 1] else k
            p = bisect.bisect_right(base.reach, usable, 0, usable)
            need_of = base.need
            reusable = p + sum(1 for i in range(p, usable) if need_of[i] <= usable)
        else:
            norm = normalize_messages(messages, self.fmt)
            usable = p = reusable = 0
        if base is None or reusable < self.bodies_min or 2 * reusable < n:
            text, bodies, need, reach, last = self._render_marked(norm, variables)
            return self._keep(messages, norm, text, bodies, need, reach, last, values, base, k, 0)
        bodies, need, reach, last = base.bodies[:p], base.need[:p], base.reach[:p], base.last[:p]
        reused = p
        view = _MessageView(norm)
        ctx = split.body.new_context({**split.globals, **variables, "messages": view}, shared=True)
        run = split.body.root_render_func
        target = split.target
        local = ctx.vars
        top = reach[-1] if reach else 0
        r = view._reads = _Reads()
        stand_in = local["loop"] = _Loop(0, n, r)
        for i in range(p, n):
            if base is not None and i < usable and base.need[i] <= usable:
                body, wants, read_last = base.bodies[i], base.need[i], base.last[i]
                reused += 1
            else:
                r.high, r.unstable, r.last, r.length = -1, False, False, False
                stand_in._i = i
                local[target] = norm[i]
                body = "".join(run(ctx))
                wants, read_last = _need(i, n, r), r.last
            bodies.append(body)
            need.append(wants)
            last.append(read_last)
            top = max(top, wants)
            reach.append(top)
        frame = split.frame.new_context({**split.globals, **variables, "messages": norm, BODY_VAR: "".join(bodies)},
                                        shared=True)
        text = "".join(split.frame.root_render_func(frame))
        return self._keep(messages, norm, text, bodies, need, reach, last, values, base, k, reused)

    def _render_marked(self, norm: list[dict[str, Any]],
                       variables: Mapping[str, Any]) -> tuple[str, list[str], list[int], list[int], list[bool]]:
        """The whole template in one render (about its own cost), its bodies cut out at the marks.

        Each body's ``messages[i]`` reads are recorded as it runs (jinja's generator yields the mark
        before the body's code runs); its ``loop`` reads cannot be, so what the template's bodies may
        read of it (``SplitTemplate.reads_last``, ``reads_length``) is assumed read."""
        split = self.split
        n = len(norm)
        view = _MessageView(norm)
        idle = view._reads = _Reads()  # the frame's own reads
        ctx = split.marked.new_context({**split.globals, **self._marks, **variables, "messages": view},
                                       shared=True)
        out: list[str] = []
        append = out.append
        cuts: list[int] = []  # where in ``out`` each body starts, then where the loop ended
        reads: list[_Reads] = []
        ended = False
        for piece in split.marked.root_render_func(ctx):
            if type(piece) is not _Mark:
                append(piece)
            elif piece is _BODY and not ended:
                cuts.append(len(out))
                view._reads = r = _Reads()
                reads.append(r)
            elif piece is _END and not ended:
                cuts.append(len(out))
                view._reads = idle
                ended = True
            else:
                raise _Untracked  # marks out of order (cannot happen in the loop's shape): render it whole
        if len(reads) != n or not ended:
            raise _Untracked  # not one body per message after all: render it whole
        bodies = ["".join(out[cuts[i] : cuts[i + 1]]) for i in range(n)]
        never = split.reads_length
        need = [_NEVER if never or r.unstable else max(i, r.high) + 1 for i, r in enumerate(reads)]
        if split.reads_last and n:
            need[-1] = _NEVER  # the last message's body read loop.last as True
        reach = list(itertools.accumulate(need, max))
        return "".join(out), bodies, need, reach, [split.reads_last] * n

    def _keep(self, messages: Sequence[Any], norm: list[dict[str, Any]], text: str, bodies: list[str],
              need: list[int], reach: list[int], last: list[bool], values: tuple[Any, ...], base: _Entry | None,
              k: int, reused: int) -> str:
        """Store the render as an entry (``base`` leaves when the new one extends it) and return its text."""
        n = len(messages)
        # a plain message: a dict equal to it, ours (the caller may change its own later); in "string" format
        # its normalised dict is one
        string = self.fmt == "string"
        cmp: list[Any] = []
        for i in range(k, n):
            m = messages[i]
            if type(m) is dict and len(m) == 2 and type(m.get("role")) is str and type(m.get("content")) is str:
                cmp.append(norm[i] if string else {"role": m["role"], "content": m["content"]})
            else:
                cmp.append(_Strict(_frozen(m)))
        entry = _Entry((base.cmp[:k] if base is not None else []) + cmp, norm, bodies, need, reach, last, values,
                       len(text))
        with self._lock:
            self._store(entry, base if base is not None and k == len(base.cmp) else None)
            self.hits += reused > 0
            self.reused += reused
            self.rendered += n - reused
        return text

    def _store(self, entry: _Entry, superseded: _Entry | None) -> None:
        """Index ``entry`` under its last two prefix lengths; ``superseded`` (a prefix of it) leaves."""
        if superseded is not None and id(superseded) in self._lru:
            self._drop(superseded)
        n = len(entry.cmp)
        for k in (n, n - 1):
            if k > 0:
                c = entry.cmp[k - 1]  # hashed as _hkey hashes the raw message it stands for
                slot = (k, hash((c["role"], c["content"])) if type(c) is dict else hash(c))
                self._keys[slot] = entry
                entry.slots.append(slot)
        self._lru[id(entry)] = entry
        self._bytes += entry.size
        while self._bytes > self.max_bytes and len(self._lru) > 1:
            self._drop(next(iter(self._lru.values())))

    def _drop(self, entry: _Entry) -> None:
        del self._lru[id(entry)]
        self._bytes -= entry.size
        for slot in entry.slots:
            if self._keys.get(slot) is entry:
                del self._keys[slot]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()
