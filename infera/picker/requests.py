"""What the picker reads of a request the proxy holds: its path and JSON body, as the router's request.

The body is only read, never changed: the gateway forwards it as the client sent it, and the
frontend sidecar behind the gateway does the API work (validation, Anthropic translation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from infera.protocols import anthropic
from infera.protocols.anthropic_convert import to_openai
from infera.protocols.openai import error_body
from infera.router.router import RouteRequest

ANTHROPIC_PATH = "/v1/messages"
CHAT_PATHS = ("/v1/chat/completions", ANTHROPIC_PATH)
COMPLETION_PATHS = ("/v1/completions",)


class BadRequest(ValueError):
    """The body cannot be routed (not JSON, no model); the sidecar would refuse it too."""


def route_request(path: str, body: bytes, patterns: Sequence[re.Pattern[str]]) -> RouteRequest | None:
    """The router's view of a request, or None for a path that carries no prompt (e.g. ``/v1/models``)."""
    path = path.split("?", 1)[0]
    if path not in CHAT_PATHS and path not in COMPLETION_PATHS:
        return None
    try:
        payload = orjson.loads(body) if body else None
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not JSON: {exc}") from exc
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
        raise BadRequest("the request body has no 'model'")
    if path == ANTHROPIC_PATH:
        try:
            payload = to_openai(anthropic.MessagesRequest.model_validate(payload))
        except (ValidationError, ValueError) as exc:
            raise BadRequest(f"not a Messages request: {exc}") from exc
    kind: Literal["chat", "completion"] = "chat" if path in CHAT_PATHS else "completion"
    if kind == "chat" and patterns:
        payload = {**payload, "messages": _strip(payload.get("messages"), patterns)}
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    return RouteRequest(kind=kind, path=path, body=body, payload=payload, model=payload["model"],
                        max_tokens=limit if isinstance(limit, int) else None)


def _strip(messages: Any, patterns: Sequence[re.Pattern[str]]) -> Any:
    """System prompts without per-request nonces, as the sidecar will forward them."""
    if not isinstance(messages, list):
        return messages
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), str):
            text = m["content"]
            for p in patterns:
                text = p.sub("", text)
            m = {**m, "content": text}
        out.append(m)
    return out


def error_json(path: str, status: int, message: str) -> tuple[int, bytes]:
    """Status and body of an error in the shape of the API the client called."""
    if path.split("?", 1)[0] == ANTHROPIC_PATH:
        # 503 stays 503 (the endpoint picker protocol says so), with Anthropic's "overloaded" type.
        kinds = {503: "overloaded_error", 429: "rate_limit_error"}
        kind = kinds.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")
        return status, orjson.dumps(anthropic.error_body(kind, message))
    openai_kinds: Mapping[int, str] = {400: "invalid_request_error", 429: "rate_limit_error",
                                       503: "service_unavailable"}
    return status, orjson.dumps(error_body(message, openai_kinds.get(status, "server_error"), None, status))
