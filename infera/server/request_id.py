"""Request ids: every request has one ``x-request-id``, from the client or made here.

A client's id is kept when it is 1-128 visible ASCII characters (anything else, for
example a 10 kB or control-character value, is replaced rather than echoed or forwarded);
otherwise one is generated (``req_`` + 24 hex digits). The id is put in the request's
headers, so the relays forward it to the engine (``infera.server.relay.FORWARD_HEADERS``),
and returned in the response's ``x-request-id`` header. Anthropic's error shape has a
``request_id`` field; an error body under ``/v1/messages`` gets it. A pure ASGI
middleware: one header scan and one header appended per request.
"""

from __future__ import annotations

import os

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
MAX_LENGTH = 128
ANTHROPIC_PREFIX = "/v1/messages"


def valid(value: bytes) -> bool:
    """A client-given id is kept only when it is 1-128 visible ASCII characters."""
    return 0 < len(value) <= MAX_LENGTH and all(0x21 <= b <= 0x7E for b in value)


_BATCH = 64
_ids: list[bytes] = []  # made ahead, taken from the end
os.register_at_fork(after_in_child=_ids.clear)  # a forked server process must not hand out its parent's ids


def new_id() -> str:
    return new_id_bytes().decode()


def new_id_bytes() -> bytes:
    """``req_`` + 24 random hex digits; one ``os.urandom`` call per 64 ids (a syscall each otherwise)."""
    if not _ids:
        raw = os.urandom(12 * _BATCH).hex().encode()
        _ids.extend(b"req_" + raw[i:i + 24] for i in range(0, 24 * _BATCH, 24))
    return _ids.pop()


def take_id(headers: list[tuple[bytes, bytes]]) -> tuple[bytes, list[tuple[bytes, bytes]] | None]:
    """The request's id and, when one had to be made, the headers to use instead (the given list is
    not changed)."""
    given = None
    for key, value in headers:  # a plain loop: no generator and next() per request
        if key == HEADER:
            given = value
            break
    if given is not None and valid(given):
        return given, None
    rid = new_id_bytes()
    kept = [(k, v) for k, v in headers if k != HEADER] if given is not None else headers
    return rid, [*kept, (HEADER, rid)]


def id_sender(send: Send, rid: bytes, path: str) -> Send:
    """``send`` with the id in the response's headers (and, under /v1/messages, in an error's body)."""
    inject = path.startswith(ANTHROPIC_PREFIX)
    held: list[Message] = []

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (HEADER, rid)]}
            if inject and message["status"] >= 400 and _json(message):
                held.append(message)  # an Anthropic error: its body gets the id (it is small)
                return
        elif held and message["type"] == "http.response.body":
            held.append(message)
            if message.get("more_body", False):
                return
            await _send_error(send, held, rid.decode())
            return
        await send(message)

    return send_with_id


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid, headers = take_id(scope["headers"])
        if headers is not None:
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, id_sender(send, rid, scope["path"]))


def _json(start: Message) -> bool:
    return any(k == b"content-type" and v.startswith(b"application/json") for k, v in start.get("headers", ()))


def error_with_id(body: bytes, rid: str) -> bytes | None:
    """An Anthropic error body with ``request_id`` added; None when ``body`` is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict) and data.get("type") == "error":
        return orjson.dumps({**data, "request_id": rid})
    return None


async def _send_error(send: Send, held: list[Message], rid: str) -> None:
    """Send a held Anthropic error response with ``request_id`` in its body (as is if it is not one)."""
    start, body = held[0], b"".join(m.get("body", b"") for m in held[1:])
    with_id = error_with_id(body, rid)
    if with_id is not None:
        body = with_id
        start = {**start, "headers": [(k, str(len(body)).encode() if k == b"content-length" else v)
                                      for k, v in start["headers"]]}
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
