"""The frontend's FastAPI app: routes over an already built router (see ``__main__``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from fastapi import FastAPI

from infera import __version__
from infera.router.router import Router
from infera.server.admin import AdminHandlers
from infera.server.errors import install_error_handlers
from infera.server.metrics import ServerMetrics
from infera.server.openai_api import OpenAIHandlers

Hook = Callable[[], Awaitable[None]]


def build_app(router: Router, *, max_body_bytes: int, strip_patterns: Sequence[str],
              on_start: Sequence[Hook] = (), on_stop: Sequence[Hook] = ()) -> FastAPI:
    """``on_start`` hooks run in order at startup, ``on_stop`` hooks in order at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for hook in on_start:
            await hook()
        try:
            yield
        finally:
            for hook in on_stop:
                await hook()

    app = FastAPI(title="infera", version=__version__, lifespan=lifespan)
    metrics = ServerMetrics(router)
    app.state.router = router
    app.state.metrics = metrics
    install_error_handlers(app)
    app.include_router(OpenAIHandlers(router, metrics, max_body_bytes, strip_patterns).routes())
    app.include_router(AdminHandlers(router, metrics).routes())
    return app
