"""The inference routes' short way in: a POST to one of them skips FastAPI's routing stack.

A request to ``/v1/chat/completions`` through FastAPI passes eleven ASGI layers before its
handler runs (server-error, exception telemetry, body limit, the user middlewares, exception
middleware, exit stack, the router's path matching over every route, the included router,
the route, ``request_response`` and its exception wrapper), and each response message passes
most of them again on the way out: ~6 % of a round-robin frontend's profile samples. Here a POST whose
path is a hot route goes to its handler through only what gives it a behaviour:

- ``ServerErrorMiddleware`` with the app's ``Exception`` handler, outermost as in FastAPI (an
  unexpected exception is a 500 in the shape of the API called, then re-raised);
- every user middleware, in the same order (request ids, telemetry, the admin token, the
  direct-mode default worker);
- the handler, called with a ``Request`` and its response sent.

What is skipped does nothing for these routes: they raise no ``HTTPException`` (each handler
renders its own errors), take no dependencies, files or forms, FastAPI's own telemetry is not
configured (infera's is the ``Observe`` middleware, kept) and no body limit is set on the app
(intake bounds the body itself). Any other method or path takes the full FastAPI stack, so a
GET on a hot path is still a 405 and the routes stay in the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]


class Endpoints:
    """The innermost app of the short way: the path's handler, then its response."""

    __slots__ = ("_endpoints",)

    def __init__(self, endpoints: Mapping[str, Endpoint]) -> None:
        self._endpoints = dict(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._endpoints[scope["path"]](Request(scope, receive, send))
        await response(scope, receive, send)


class InferaApp(FastAPI):
    """FastAPI, with :meth:`hot` routes served the short way (module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hot: dict[str, Endpoint] = {}
        self._hot_stack: ASGIApp | None = None

    def hot(self, endpoints: Mapping[str, Endpoint]) -> None:
        """Serve a POST to each path the short way; the path must also be an ordinary route."""
        if self._hot_stack is not None:
            raise RuntimeError("hot routes must be added before the app serves")
        self._hot.update(endpoints)

    def hot_endpoints(self) -> dict[str, Endpoint]:
        """The hot routes' handlers by path (the protocol's lean path calls them: :mod:`infera.server.lean`)."""
        return dict(self._hot)

    def _build_hot_stack(self) -> ASGIApp:
        app: ASGIApp = Endpoints(self._hot)
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        handler = self.exception_handlers.get(Exception, self.exception_handlers.get(500))
        return ServerErrorMiddleware(app, handler=handler, debug=self.debug)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self._hot:
            scope["app"] = self
            if self.root_path:
                scope["root_path"] = self.root_path
            stack = self._hot_stack
            if stack is None:
                stack = self._hot_stack = self._build_hot_stack()
            await stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
