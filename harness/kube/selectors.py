"""Label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!``) and field selectors
(dotted paths such as ``metadata.name``), as list and watch requests carry them."""

from __future__ import annotations

import re
from typing import Any

_SET = re.compile(r"^\s*([^\s!=,()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_match(selector: str, labels: dict[str, str]) -> bool:
    for term in _split_selector(selector or ""):
        m = _SET.match(term)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            ok = key in labels and labels[key] in values if op == "in" else labels.get(key) not in values
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def field_match(selector: str, obj: dict[str, Any]) -> bool:
    for term in _split_selector(selector or ""):
        negate = "!=" in term
        key, value = (s.strip() for s in term.replace("!=", "=").replace("==", "=").split("=", 1))
        node: Any = obj
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (str(node) == value) == negate:
            return False
    return True
