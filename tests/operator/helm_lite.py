"""Renders the subset of Helm's template language that charts/infera uses, for tests on machines
without the helm binary: ``.Values``/``.Release`` lookups, ``quote``, ``toYaml | nindent N``,
``.Files.Get "path" | nindent N`` (read from the chart folder), ``if``/``range $k, $v :=``/``end``, and
``{{-`` whitespace trimming. Anything else raises, so the chart
cannot drift into constructs this check would silently mis-render.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

_TAG = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


def _lookup(path: str, scope: dict[str, Any]) -> Any:
    if path.startswith("$"):
        return scope[path]
    node: Any = scope["."]
    for part in path.lstrip(".").split("."):
        node = node[part] if isinstance(node, dict) else None
    return node


def _eval(expr: str, scope: dict[str, Any]) -> str:
    parts = [p.strip() for p in expr.split("|")]
    head = parts[0].split()
    if head[0] in ("toYaml", ".Files.Get"):
        if head[0] == "toYaml":
            value: Any = _lookup(head[1], scope)
            text = yaml.safe_dump(value, default_flow_style=False, sort_keys=False).rstrip("\n")
        else:
            chart: Path | None = scope["."]["Chart"]
            if chart is None:
                raise ValueError(".Files.Get needs the chart folder: render(..., chart=CHART)")
            text = (chart / json.loads(head[1])).read_text(encoding="utf-8").rstrip("\n")
        for p in parts[1:]:
            m = re.fullmatch(r"nindent (\d+)", p)
            if not m:
                raise ValueError(f"unsupported pipe {p!r}")
            pad = " " * int(m.group(1))
            text = "\n" + "\n".join(pad + line for line in text.splitlines())
        return text
    if len(head) != 1:
        raise ValueError(f"unsupported expression {expr!r}")
    value = _lookup(head[0], scope)
    for p in parts[1:]:
        if p != "quote":
            raise ValueError(f"unsupported pipe {p!r}")
        value = json.dumps(value if isinstance(value, str) else str(value).lower() if isinstance(value, bool)
                           else str(value))
    return str(value)


def render(template: str, values: dict[str, Any], release: str = "infera", namespace: str = "infera-system",
           chart: Path | None = None) -> str:
    tokens: list[tuple[str, str]] = []
    pos = 0
    for m in _TAG.finditer(template):
        text = template[pos:m.start()]
        if m.group(1):
            text = text.rstrip(" \t\n")
        tokens.append(("text", text))
        tokens.append(("tag", m.group(2)))
        pos = m.end()
    tokens.append(("text", template[pos:]))
    root = {".": {"Values": values, "Release": {"Name": release, "Namespace": namespace}, "Chart": chart}}

    def run(i: int, scope: dict[str, Any], emit: bool) -> tuple[str, int]:
        out = []
        while i < len(tokens):
            kind, body = tokens[i]
            i += 1
            if kind == "text":
                out.append(body if emit else "")
                continue
            if body == "end":
                return "".join(out), i
            m_if = re.fullmatch(r"if (\S+)", body)
            m_range = re.fullmatch(r"range (\$\w+), (\$\w+) := (\S+)", body)
            if m_if:
                text, i = run(i, scope, emit and bool(_lookup(m_if.group(1), scope)))
                out.append(text)
            elif m_range:
                items = (_lookup(m_range.group(3), scope) or {}) if emit else {}
                start, end = i, i
                for key in sorted(items) or [None]:
                    inner = {**scope, m_range.group(1): key, m_range.group(2): items.get(key) if key else None}
                    text, end = run(start, inner, emit and key is not None)
                    out.append(text)
                i = end
            else:
                out.append(_eval(body, scope) if emit else "")
        return "".join(out), i

    text, _ = run(0, root, True)
    return text
