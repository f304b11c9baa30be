"""The admin token: ``/v1/admin/...`` and ``/v1/cache/prewarm`` need ``Authorization: Bearer <token>``.

A pure ASGI middleware (no per-request cost on other paths beyond a prefix check, and none
at all when no token is set: it is not installed). A missing or wrong token is a 401 in
OpenAI's error shape; the comparison is constant-time.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from infera.server.errors import openai_error

ADMIN_PREFIX = "/v1/admin/"
ADMIN_PATHS = frozenset({"/v1/cache/prewarm"})


def is_admin_path(path: str) -> bool:
    return path.startswith(ADMIN_PREFIX) or path in ADMIN_PATHS


class AdminTokenMiddleware:
    def __init__(self, app: ASGIApp, token: str) -> None:
        if not token:
            raise ValueError("an empty admin token protects nothing")
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_admin_path(scope["path"]):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self._expected):
                message = ("this endpoint needs the admin token: 'Authorization: Bearer <token>'" if not given
                           else "the admin token is wrong")
                response = openai_error(401, message)
                response.headers["www-authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
