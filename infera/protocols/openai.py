"""OpenAI request validation and error shape (the parts a router must check itself).

Bodies are forwarded to engines as the client sent them; these models only check what
the router relies on (model, messages/prompt, token limits, stream flags) and give a
clear 400 naming the offending field. Unknown fields pass through untouched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infera.protocols.nonces import strip_text

__all__ = [
    "ChatCompletionRequest",
    "Checked",
    "CompletionRequest",
    "ValidationError",
    "check_chat",
    "check_completion",
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


class Checked:
    """What the router reads of a request that :func:`check_chat` or :func:`check_completion` passed:
    the model and the output limit, as the pydantic model would give them."""

    __slots__ = ("_limit", "model")

    def __init__(self, model: str, limit: int | None) -> None:
        self.model = model
        self._limit = limit

    def output_limit(self) -> int | None:
        return self._limit


# The quick checks below accept only what the models above accept (a narrower set: exact JSON types, no
# coercion), so a request they pass is valid and anything else goes to the models, which word the error.
# They are what the hot path runs: a whole pydantic validation of a chat request cost ~10 µs of the
# frontend's ~25 µs of intake (bench/README.md, "Issue 15, sixth round"). A property test holds them to the
# models (tests/protocols/test_openai_quick.py).
_ROLES = frozenset(get_args(ChatMessage.model_fields["role"].annotation))
_BOOL_OR_NULL = (bool, type(None))


def _int_at_least_1(value: object) -> bool:
    return type(value) is int and value >= 1


def _number_in(value: object, low: float, high: float, low_open: bool) -> bool:
    if type(value) is not float and type(value) is not int:
        return False
    return (low < value if low_open else low <= value) and value <= high


def _common(payload: dict[str, Any]) -> bool:
    """The fields of :class:`_Common` other than ``model`` and ``max_tokens``."""
    get = payload.get
    if "stream" in payload and type(payload["stream"]) is not bool:
        return False
    options = get("stream_options")
    if options is not None and not (type(options) is dict and type(options.get("include_usage")) in _BOOL_OR_NULL):
        return False
    if "n" in payload and not (type(n := payload["n"]) is int and 1 <= n <= 128):
        return False
    temperature = get("temperature")
    if temperature is not None and not _number_in(temperature, 0, 2, False):
        return False
    top_p = get("top_p")
    if top_p is not None and not _number_in(top_p, 0, 1, True):
        return False
    stop = get("stop")
    return stop is None or type(stop) is str or (type(stop) is list and all(type(s) is str for s in stop))


def _model_and_max(payload: dict[str, Any]) -> tuple[str, int | None] | None:
    model = payload.get("model")
    if type(model) is not str or not model:
        return None
    max_tokens = payload.get("max_tokens")
    if max_tokens is not None and not _int_at_least_1(max_tokens):
        return None
    return model, max_tokens


def check_chat(payload: dict[str, Any]) -> Checked | None:
    """``payload`` (a JSON object) as a valid :class:`ChatCompletionRequest`'s model and output limit, or
    None when it is not certainly valid (then validate it with the model, which words the error)."""
    head = _model_and_max(payload)
    if head is None or not _common(payload):
        return None
    messages = payload.get("messages")
    if type(messages) is not list or not messages:
        return None
    for message in messages:
        if type(message) is not dict or type(role := message.get("role")) is not str or role not in _ROLES:
            return None
        content = message.get("content")
        if content is not None and type(content) is not str and not (
                type(content) is list and all(type(part) is dict for part in content)):
            return None
    limit = payload.get("max_completion_tokens")
    if limit is not None and not _int_at_least_1(limit):
        return None
    tools = payload.get("tools")
    if tools is not None and not (type(tools) is list and all(type(tool) is dict for tool in tools)):
        return None
    return Checked(head[0], limit or head[1])


def _token_ids(values: list[Any]) -> bool:
    return all(type(v) is int and 0 <= v < 2**32 for v in values)


def check_completion(payload: dict[str, Any]) -> Checked | None:
    """As :func:`check_chat`, for a :class:`CompletionRequest`."""
    head = _model_and_max(payload)
    if head is None or not _common(payload):
        return None
    prompt = payload.get("prompt")
    if type(prompt) is not str:
        if type(prompt) is not list:
            return None
        if not (all(type(p) is str for p in prompt) or _token_ids(prompt)
                or all(type(p) is list and _token_ids(p) for p in prompt)):
            return None
    return Checked(*head)


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
