"""Deterministic tool calls: when a chat request carries ``tools``, the mock calls one of them.

The tool is the one named by ``tool_choice`` or else one picked by the prompt-seeded RNG;
its arguments are generated from the tool's JSON-schema ``parameters``. The arguments'
tokens are the output tokens, so a tool call costs decode steps like text does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from infera.engine.mock.text import WORDS, PlannedOutput, ToolCall


def wants_tool_call(tools: Any, tool_choice: Any) -> bool:
    return bool(tools) and tool_choice != "none"


def _pick_tool(tools: Sequence[Any], tool_choice: Any, rng: random.Random) -> dict[str, Any]:
    functions: list[dict[str, Any]] = [
        t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    if not functions:
        raise ValueError("tools must be a list of {type: function, function: {name, parameters}}")
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        for fn in functions:
            if fn.get("name") == wanted:
                return fn
        raise ValueError(f"tool_choice names an unknown function: {wanted!r}")
    return functions[rng.randrange(len(functions))]


def _value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    if not isinstance(schema, dict):
        return rng.choice(WORDS)
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.random() * 100, 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return [] if depth > 3 else [_value(schema.get("items"), rng, depth + 1)]
    if kind == "object":
        if depth > 3:
            return {}
        props = schema.get("properties") or {}
        return {name: _value(sub, rng, depth + 1) for name, sub in props.items()}
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def plan_tool_call(
    tools: Sequence[Any], tool_choice: Any, rng: random.Random, encode: Callable[[str], list[int]]
) -> PlannedOutput:
    fn = _pick_tool(tools, tool_choice, rng)
    arguments = json.dumps(_value(fn.get("parameters") or {"type": "object"}, rng))
    ids = encode(arguments) or [0]
    n, length = len(ids), len(arguments)
    cuts = [round(i * length / n) for i in range(n + 1)]
    pieces = [arguments[cuts[i]:cuts[i + 1]] for i in range(n)]
    call = ToolCall(id=f"call_{rng.getrandbits(96):024x}", name=str(fn.get("name", "")), arguments=arguments)
    return PlannedOutput(ids=ids, pieces=pieces, finish_reason="tool_calls", tool_call=call)
