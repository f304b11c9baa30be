"""One intake path for every JSON endpoint: bounded read, JSON object, schema, nonce strip.

Each API renders an :class:`IntakeError` in its own shape (OpenAI, Anthropic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import orjson
from fastapi import Request
from pydantic import BaseModel, ValidationError

from infera.telemetry.record import clock_ns, current

M = TypeVar("M", bound=BaseModel)
Q = TypeVar("Q")
T = TypeVar("T")

Describe = Callable[[ValidationError, dict[str, Any]], tuple[str, str | None]]
"""``(error, payload) -> (message, param)``: how an API words a schema violation."""

Quick = Callable[[dict[str, Any]], Q | None]
"""``payload -> parsed | None``: a check without the schema's model that passes only valid payloads (None:
not certainly valid; the schema then validates it and words the error)."""

WHOLE_BODY = "infera.body"
"""Scope key: the request's whole body, put there by the server's protocol when it had all of it before the
handler ran (the lean path, :mod:`infera.server.lean`); :func:`read_body` takes it instead of ``receive()``."""

Strip = Callable[[dict[str, Any], Any], bool]
"""``(payload, parsed) -> changed``: remove per-request nonces from the prompt; True when the
payload changed (the forwarded body is then re-encoded from it)."""


class IntakeError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclasses.dataclass(slots=True)
class Intake(Generic[T]):
    body: bytes  # what is forwarded (re-encoded when nonces were stripped)
    payload: dict[str, Any]
    parsed: T


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes without reading them all.

    Reads the ASGI messages directly (no stream generator); a body in one message, the usual
    case, is returned as is; a body the protocol handed over whole (:data:`WHOLE_BODY`) without a message."""
    scope = request.scope
    declared = None
    for key, value in scope["headers"]:
        if key == b"content-length":
            declared = value
            break
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    whole: bytes | None = scope.pop(WHOLE_BODY, None)
    if whole is not None:
        if len(whole) > limit:
            raise _too_large(limit)
        return whole
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # gone, or cut off by --client-body-timeout: nobody reads the answer
            raise IntakeError(499, "the client went away before its request body was complete")
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> IntakeError:
    return IntakeError(413, f"request body exceeds {limit} bytes")


async def take(request: Request, limit: int, schema: type[M], describe: Describe,
               strip: Strip | None = None) -> Intake[M]:
    """Read, parse and validate a request; raises :class:`IntakeError` with the client's status.

    With telemetry on, the request's record gets its model and an ``intake`` span (bytes, outcome)."""
    return await take_quick(request, limit, schema, describe, _no_quick, strip)


def _no_quick(payload: dict[str, Any]) -> None:
    return None


async def take_quick(request: Request, limit: int, schema: type[M], describe: Describe, quick: Quick[Q],
                     strip: Strip | None = None) -> Intake[M | Q]:
    """:func:`take`, with ``quick`` tried before the schema: the parsed request is ``quick``'s when it
    passes the payload, else the schema's model (and its error when the payload is invalid)."""
    record = current()
    if record is None:
        return await _take(request, limit, schema, describe, quick, strip)
    start = clock_ns()
    try:
        intake = await _take(request, limit, schema, describe, quick, strip)
    except IntakeError as exc:
        record.intake(start, 0, str(exc), exc.status)
        raise
    model = intake.payload.get("model")
    record.model = model if isinstance(model, str) else ""
    record.intake(start, len(intake.body))
    return intake


async def _take(request: Request, limit: int, schema: type[M], describe: Describe, quick: Quick[Q],
                strip: Strip | None = None) -> Intake[M | Q]:
    body = await read_body(request, limit)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise IntakeError(400, f"malformed JSON body: {exc}") from exc
    if not isinstance(payload, dict):
        raise IntakeError(400, "the request body must be a JSON object")
    parsed: M | Q | None = quick(payload)
    if parsed is None:
        try:
            parsed = schema.model_validate(payload)
        except ValidationError as exc:
            message, param = describe(exc, payload)
            raise IntakeError(400, message, param) from exc
    if strip is not None and strip(payload, parsed):
        body = orjson.dumps(payload)
    return Intake(body, payload, parsed)
