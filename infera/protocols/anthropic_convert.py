"""Pure translation between Anthropic messages and the engines' OpenAI chat API.

Requests go Anthropic -> OpenAI (:func:`to_openai`); whole responses come back OpenAI ->
Anthropic (:func:`from_openai`). The helpers for stop reasons, usage and tool input are
shared with the stream translator so a streamed message ends exactly as the whole one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from infera.protocols.anthropic import (
    ChoiceAny,
    ChoiceAuto,
    ChoiceNone,
    ChoiceTool,
    CountTokensRequest,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    TranslationError,
)
from infera.protocols.nonces import strip_text

# ---- requests: Anthropic -> OpenAI -------------------------------------------------------

def strip_system(req: CountTokensRequest, patterns: Sequence[re.Pattern[str]]) -> bool:
    """Remove per-request nonces from the system prompt in place; True if anything changed.

    A system block left empty by it is dropped, so the remaining prompt is byte-identical
    across requests that differed only in the nonce.
    """
    if not patterns or req.system is None:
        return False
    if isinstance(req.system, str):
        new = _strip(req.system, patterns)
        changed = new != req.system
        req.system = new
        return changed
    blocks = [b.model_copy(update={"text": _strip(b.text, patterns)}) for b in req.system]
    changed = any(a.text != b.text for a, b in zip(blocks, req.system, strict=True))
    req.system = [b for b in blocks if b.text] if changed else req.system
    return changed


def _strip(text: str, patterns: Sequence[re.Pattern[str]]) -> str:
    return strip_text(text, patterns)


def _parts(texts: Sequence[str]) -> str | list[dict[str, Any]]:
    """One string for one text, OpenAI text parts for several (engines join parts with newlines)."""
    return texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]


def openai_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """The conversation as OpenAI chat messages: tool_use -> tool_calls, tool_result -> tool messages."""
    out: list[dict[str, Any]] = []
    if isinstance(req.system, str) and req.system:
        out.append({"role": "system", "content": req.system})
    elif isinstance(req.system, list) and req.system:
        out.append({"role": "system", "content": _parts([b.text for b in req.system])})
    for msg in req.messages:
        blocks = msg.content
        texts = [b.text for b in blocks if isinstance(b, TextBlock)]
        if msg.role == "assistant":
            calls = [{"id": b.id, "type": "function",
                      "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}}
                     for b in blocks if isinstance(b, ToolUseBlock)]
            entry: dict[str, Any] = {"role": "assistant", "content": _parts(texts) if texts else None}
            if calls:
                entry["tool_calls"] = calls
            elif not texts:
                entry["content"] = ""
            out.append(entry)
            continue
        # Tool results first: OpenAI wants tool messages right after the assistant's tool_calls.
        for b in blocks:
            if isinstance(b, ToolResultBlock):
                content = b.text()
                out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                            "content": f"Error: {content}" if b.is_error else content})
        if texts:
            out.append({"role": "user", "content": _parts(texts)})
    return out


def openai_tools(req: CountTokensRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    return [{"type": "function", "function": {
        "name": t.name, **({"description": t.description} if t.description is not None else {}),
        "parameters": t.input_schema}} for t in req.tools]


def to_openai(req: MessagesRequest) -> dict[str, Any]:
    """The OpenAI chat completion body that asks an engine for what ``req`` asks of Claude."""
    body: dict[str, Any] = {"model": req.model, "messages": openai_messages(req), "max_tokens": req.max_tokens}
    tools = openai_tools(req)
    choice = req.tool_choice
    if tools is not None:
        body["tools"] = tools
    if isinstance(choice, ChoiceNone):
        body["tool_choice"] = "none"
    elif isinstance(choice, ChoiceAny):
        body["tool_choice"] = "required"
    elif isinstance(choice, ChoiceTool):
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif isinstance(choice, ChoiceAuto):
        body["tool_choice"] = "auto"
    if tools is not None and isinstance(choice, ChoiceAuto | ChoiceAny | ChoiceTool) \
            and choice.disable_parallel_tool_use:
        body["parallel_tool_calls"] = False
    if req.messages[-1].role == "assistant":
        # Anthropic continues a final assistant turn (prefill); vLLM and SGLang spell it this way.
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    if req.stop_sequences:
        body["stop"] = list(req.stop_sequences)
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.top_p == 0:  # Anthropic allows it, OpenAI wants > 0; keeping only the top token is top_k 1
        del body["top_p"]
        body["top_k"] = 1
    if req.metadata is not None and req.metadata.user_id is not None:
        body["user"] = req.metadata.user_id
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # exact usage in the last chunk
    return body


# ---- responses: OpenAI -> Anthropic (shared with the stream translator) -----------------

def tool_use_id(message_id: str, index: int) -> str:
    """An id for a tool call the engine sent without one."""
    return f"toolu_{message_id.removeprefix('msg_')}_{index}"


def stop_reason(finish_reason: str | None, matched: Any, stop_sequences: Sequence[str] | None,
                tool_calls: bool) -> tuple[str, str | None]:
    """Anthropic's ``(stop_reason, stop_sequence)`` for an OpenAI finish.

    ``matched`` is what the engine says ended the text (vLLM ``stop_reason``, SGLang
    ``matched_stop``): a stop string, a token id, or None.
    """
    if finish_reason == "length":
        return "max_tokens", None
    if tool_calls or finish_reason in ("tool_calls", "function_call"):
        return "tool_use", None
    if finish_reason == "content_filter":
        return "refusal", None
    if isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return "end_turn", None


def usage_from_openai(usage: Any) -> dict[str, int]:
    """Anthropic usage from OpenAI usage: ``input_tokens`` excludes the cached prefix."""
    usage = usage if isinstance(usage, dict) else {}
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    cached = int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0)
    return {"input_tokens": max(0, prompt - cached), "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": int(usage.get("completion_tokens") or 0)}


def tool_input(arguments: Any, *, truncated: bool = False) -> dict[str, Any]:
    """A tool call's arguments (JSON text, or an object some engines send) as Anthropic's ``input``.

    ``truncated`` (the output hit max_tokens): the JSON is read as far as it goes, as the
    SDK's stream accumulator reads partial JSON, so both paths agree.
    """
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        value = from_json(arguments, allow_partial=True) if truncated else json.loads(arguments)
    except (TypeError, ValueError) as exc:
        raise TranslationError(f"the engine returned tool arguments that are not JSON: {arguments!r:.200}") from exc
    if not isinstance(value, dict):
        raise TranslationError(f"the engine returned tool arguments that are not a JSON object: {arguments!r:.200}")
    return value


def from_openai(resp: Any, *, message_id: str, model: str, stop_sequences: Sequence[str] | None) -> dict[str, Any]:
    """An Anthropic ``message`` from an OpenAI chat completion (first choice)."""
    choices = resp.get("choices") if isinstance(resp, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise TranslationError("the engine's response has no choices")
    choice = choices[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls") or []
    truncated = choice.get("finish_reason") == "length"
    for i, call in enumerate(calls):
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or tool_use_id(message_id, i),
                        "name": fn.get("name") or "", "input": tool_input(fn.get("arguments"), truncated=truncated)})
    matched = choice.get("stop_reason") or choice.get("matched_stop")
    reason, sequence = stop_reason(choice.get("finish_reason"), matched, stop_sequences, bool(calls))
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_from_openai(resp.get("usage"))}
