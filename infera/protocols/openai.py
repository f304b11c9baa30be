"""OpenAI request validation and error shape (the parts a router must check itself).

Bodies are forwarded to engines as the client sent them; these models only check what
the router relies on (model, messages/prompt, token limits, stream flags) and give a
clear 400 naming the offending field. Unknown fields pass through untouched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infera.protocols.nonces import strip_text

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "ValidationError",
    "error_body",
    "first_error",
    "strip_system_nonces",
]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(_Lenient):
    include_usage: bool | None = None


class _Common(_Lenient):
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# A token id outside 32 bits reached engines as given, and their KV events then broke the router's
# block hashing (ids are hashed as uint32), ending that worker's event stream: refuse it here.
TokenId = Annotated[int, Field(ge=0, lt=2**32)]


class CompletionRequest(_Common):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]

    def output_limit(self) -> int | None:
        return self.max_tokens


def error_body(message: str, kind: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def first_error(exc: ValidationError) -> tuple[str, str | None]:
    """A one-line message and the dotted field path of the first validation error."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if not str(p).startswith(("function-", "list[", "str", "int"))]
    param = ".".join(loc) or None
    text = err.get("msg", "invalid value")
    if err.get("type") == "missing":
        return f"'{param}' is a required property", param
    return f"Invalid value for '{param}': {text}", param


def strip_system_nonces(payload: dict[str, Any], patterns: Sequence[re.Pattern[str]]) -> bool:
    """Remove ``patterns`` from system/developer message text in place; True if anything changed.

    Per-request nonces in a system prompt (e.g. a billing header line) make every prompt
    unique from its first token and defeat prefix caching on every engine.
    """
    if not patterns:
        return False
    changed = False
    for message in payload.get("messages") or ():
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            new = _strip(content, patterns)
            if new != content:
                message["content"] = new
                changed = True
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    new = _strip(text, patterns)
                    if new != text:
                        part["text"] = new
                        changed = True
    return changed


def _strip(text: str, patterns: Sequence[re.Pattern[str]]) -> str:
    return strip_text(text, patterns)
