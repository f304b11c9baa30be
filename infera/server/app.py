"""The frontend's FastAPI app: routes over an already built router (see ``__main__``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from fastapi import FastAPI
from starlette.middleware import Middleware

from infera import __version__
from infera.router.router import Router
from infera.server.admin import AdminHandlers
from infera.server.anthropic_api import AnthropicHandlers
from infera.server.auth import AdminTokenMiddleware
from infera.server.errors import install_error_handlers
from infera.server.hot_routes import InferaApp
from infera.server.metrics import ServerMetrics
from infera.server.observe import Observe
from infera.server.openai_api import OpenAIHandlers
from infera.server.openapi import install_openapi
from infera.server.prewarm import PrewarmHandlers
from infera.server.profiling import ProfilingHandlers
from infera.server.request_id import RequestIdMiddleware
from infera.telemetry.tracing import Telemetry
from infera.transport.kvd import KvdClient

Hook = Callable[[], Awaitable[None]]


def build_app(router: Router, *, max_body_bytes: int, strip_patterns: Sequence[str],
              on_start: Sequence[Hook] = (), on_stop: Sequence[Hook] = (),
              telemetry: Telemetry | None = None) -> FastAPI:
    """``on_start`` hooks run in order at startup, ``on_stop`` hooks in order at shutdown. ``telemetry``,
    when active, traces and logs each inference request (:mod:`infera.server.observe`)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for hook in on_start:
            await hook()
        try:
            yield
        finally:
            for hook in on_stop:
                await hook()

    app = InferaApp(title="infera", version=__version__, lifespan=lifespan)
    metrics = ServerMetrics(router)
    app.state.router = router
    app.state.metrics = metrics
    install_error_handlers(app)
    openai = OpenAIHandlers(router, metrics, max_body_bytes, strip_patterns)
    anthropic = AnthropicHandlers(router, metrics, max_body_bytes, strip_patterns)
    app.include_router(openai.routes())
    app.include_router(anthropic.routes())
    app.hot({**openai.hot_routes(), **anthropic.hot_routes()})  # POSTs skip FastAPI's routing stack
    app.include_router(AdminHandlers(router, metrics).routes())
    if telemetry is not None and telemetry.active:
        app.add_middleware(Observe, telemetry=telemetry)
    app.add_middleware(RequestIdMiddleware)  # outermost: Observe and the relays see the id in the headers
    install_openapi(app, router.view.models, admin_token=False)
    return app


def install_operations(app: FastAPI, router: Router, *, strip_patterns: Sequence[str], kvd_socket_path: str = "",
                       enable_profiling: bool = False, profile_timeout: float = 60.0, admin_token: str = "") -> None:
    """KV prewarm (``/v1/cache/prewarm``), fleet profiling (``/v1/admin/profile/...``) and, when a
    token is given, the admin token in front of every admin path."""
    kvd = KvdClient(kvd_socket_path) if kvd_socket_path else None
    app.include_router(PrewarmHandlers(router, kvd, strip_patterns).routes())
    app.include_router(ProfilingHandlers(router, enable_profiling, profile_timeout).routes())
    install_openapi(app, router.view.models, admin_token=bool(admin_token))
    if admin_token:  # inside the request-id middleware, so that a 401 carries the id too
        app.user_middleware.append(Middleware(AdminTokenMiddleware, token=admin_token))
