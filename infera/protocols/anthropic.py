"""Anthropic Messages API: request models, validated strictly, and the error shape.

Unknown fields and unsupported content (images, documents, thinking, server tools) are 400s
that name the field or block type: nothing is silently dropped. Translation to and from the
engines' OpenAI chat API is in :mod:`infera.protocols.anthropic_convert` (whole responses)
and :mod:`infera.protocols.anthropic_stream` (streams).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "CountTokensRequest",
    "MessagesRequest",
    "TranslationError",
    "ValidationError",
    "describe_error",
    "error_body",
]

SUPPORTED_BLOCKS = ("text", "tool_use", "tool_result")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


class TranslationError(ValueError):
    """An engine response that has no faithful Anthropic form (e.g. tool arguments that are not an object)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # accepted; engines cache prefixes on their own
    citations: list[dict[str, Any]] | None = None  # echoed back by clients; no meaning to an engine


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: list[TextBlock] = []  # a string is read as one text block
    is_error: bool = False
    cache_control: dict[str, Any] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        return _blocks(value, ("text",), "tool_result content")

    def text(self) -> str:
        return "\n".join(b.text for b in self.content)


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


def _blocks(value: Any, allowed: Sequence[str], where: str) -> Any:
    """``value`` with a string read as one text block; unsupported block types named in a 400."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else []
    if isinstance(value, list):
        for i, block in enumerate(value):
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in allowed:
                raise ValueError(f"block {i}: content block type '{kind}' is not supported in {where} by this "
                                 f"server (supported: {', '.join(allowed)})")
    return value


class InputMessage(_Strict):
    role: Literal["user", "assistant"]
    content: list[ContentBlock]  # a string is read as one text block

    @field_validator("content", mode="before")
    @classmethod
    def _supported(cls, value: Any) -> Any:
        return _blocks(value, SUPPORTED_BLOCKS, "messages")

    @model_validator(mode="after")
    def _blocks_fit_role(self) -> InputMessage:
        wrong = "tool_result" if self.role == "assistant" else "tool_use"
        if any(b.type == wrong for b in self.content):
            raise ValueError(f"'{wrong}' blocks are not allowed in {self.role} messages")
        return self


class Tool(_Strict):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tools_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(f"tool type '{kind}' (a server tool) is not supported by this server; "
                             "define client tools with name, description and input_schema")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not TOOL_NAME.match(value):
            raise ValueError("tool names must match ^[a-zA-Z0-9_-]{1,128}$")
        return value

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError("input_schema must be a JSON schema with type 'object'")
        return value


class _ChoiceBase(_Strict):
    disable_parallel_tool_use: bool | None = None


class ChoiceAuto(_ChoiceBase):
    type: Literal["auto"]


class ChoiceAny(_ChoiceBase):
    type: Literal["any"]


class ChoiceTool(_ChoiceBase):
    type: Literal["tool"]
    name: str = Field(min_length=1)


class ChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[ChoiceAuto | ChoiceAny | ChoiceTool | ChoiceNone, Field(discriminator="type")]


class Thinking(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None

    @model_validator(mode="after")
    def _disabled_only(self) -> Thinking:
        if self.type != "disabled":
            raise ValueError(f"'thinking' (extended thinking, type '{self.type}') is not supported by this "
                             "server; omit it or set its type to 'disabled'")
        return self


class Metadata(_Strict):
    user_id: str | None = None


class CountTokensRequest(_Strict):
    """The conversation part of a request: what ``/v1/messages/count_tokens`` takes."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @model_validator(mode="after")
    def _conversation(self) -> CountTokensRequest:
        _check_conversation(self.messages)
        choice = self.tool_choice
        if isinstance(choice, ChoiceTool) and choice.name not in {t.name for t in self.tools or ()}:
            raise ValueError(f"tool_choice names tool '{choice.name}', which is not in tools")
        return self


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    stream: bool = False
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: accepted, no effect


def _check_conversation(messages: Sequence[InputMessage]) -> None:
    """Anthropic's pairing rules: every tool_use is answered by a tool_result in the next message."""
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        if not msg.content and not (i == last and msg.role == "assistant"):
            raise ValueError(f"messages.{i}: all messages must have non-empty content except for the optional "
                             "final assistant message")
        if msg.role != "user":
            continue
        prev = messages[i - 1] if i else None
        asked = {b.id for b in prev.content if isinstance(b, ToolUseBlock)} if prev else set()
        for block in msg.content:
            if isinstance(block, ToolResultBlock) and block.tool_use_id not in asked:
                raise ValueError(f"messages.{i}: unexpected tool_use_id found in tool_result blocks: "
                                 f"{block.tool_use_id}. Each tool_result block must have a corresponding "
                                 "tool_use block in the previous message.")
    for i, msg in enumerate(messages[:-1]):
        ids = [b.id for b in msg.content if isinstance(b, ToolUseBlock)]
        answered = {b.tool_use_id for b in messages[i + 1].content if isinstance(b, ToolResultBlock)}
        missing = [t for t in ids if t not in answered]
        if missing:
            raise ValueError(f"messages.{i}: tool_use ids were found without tool_result blocks immediately "
                             f"after: {', '.join(missing)}. Each tool_use block must have a corresponding "
                             "tool_result block in the next message.")


# ---- errors ------------------------------------------------------------------------------

def error_body(kind: str, message: str) -> dict[str, Any]:
    """Anthropic's error object: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def describe_error(exc: ValidationError, payload: Any) -> str:
    """``path: message`` for the first validation error, the path in the client's own terms.

    Pydantic puts union member names and discriminator tags in its locations; walking the
    payload alongside keeps only the keys and indexes the client actually wrote.
    """
    err = exc.errors()[0]
    loc = list(err.get("loc", ()))
    parts: list[str] = []
    node = payload
    for i, part in enumerate(loc):
        final = i == len(loc) - 1
        if isinstance(node, dict) and not final and node.get("type") == part:
            continue  # a discriminator tag
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            parts.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parts.append(str(part))
            node = node[part]
        elif final and isinstance(part, str) and "[" not in part:
            parts.append(part)  # a missing or extra field
    text = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        text = "Extra inputs are not permitted"
    return f"{'.'.join(parts)}: {text}" if parts else text
