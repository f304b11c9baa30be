"""``python -m infera.server``: wire config -> discovery -> transports -> index -> router -> app, and serve."""

from __future__ import annotations

import gc
import logging
import socket
import sys
from collections.abc import Sequence

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp
from uvicorn.config import STARTUP_FAILURE

from infera.config import load
from infera.config.base import ConfigError
from infera.config.server import ServerSettings
from infera.router.assembly import FLEETS, KV_EVENT_SOURCES, REQUEST_TRANSPORTS, assemble
from infera.router.policies import selectable
from infera.server.app import build_app, install_operations
from infera.server.deadlines import with_deadlines
from infera.server.direct import DefaultWorkerHeader
from infera.server.drain import DrainingServer, DrainMiddleware, DrainState
from infera.server.lean import LeanPath, with_lean
from infera.server.processes import listen, supervise
from infera.telemetry.setup import build_telemetry, configure_logging

log = logging.getLogger("infera.server")


def registry_choices() -> dict[str, tuple[str, ...]]:
    """The server's flag choices, from the registries themselves (a test checks the config's lists agree)."""
    return {"router_policy": selectable(), "discovery_backend": tuple(FLEETS),
            "request_transport": tuple(REQUEST_TRANSPORTS), "kv_event_transport": (*KV_EVENT_SOURCES, "none")}


YOUNG_GC_ALLOCATIONS = 5000  # container allocations (net of deallocations) between young collections


async def freeze_heap() -> None:
    """Move everything built at start (tokenizer tables, templates, modules, the fleet) out of the cyclic
    GC's sight: a full collection then scans only what requests made. Measured: a full collection of a
    kv-aware frontend took ~250 ms, ~10 ms after this; objects that outlive a few collections (queued
    spans, for one) made such collections often enough to cost several % of CPU per request
    (bench/README.md, "Tracing and logging overhead").

    Then a young collection waits for :data:`YOUNG_GC_ALLOCATIONS` allocations instead of 700: a
    request's objects die by reference count, and a young collection (~1 ms in a loaded kv-aware
    frontend) mostly re-scanned what survives a request (token lists, index entries, tickets).
    Measured, kv-aware, 3000 ~1k-token requests: GC 237-281 ms -> 63-65 ms of CPU (bench/README.md,
    "Issue 15, fourth round")."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_ALLOCATIONS, older, oldest)


def build(settings: ServerSettings) -> FastAPI:
    telemetry = build_telemetry(settings.otel_exporter, settings.log_requests, settings.log_format, "infera-frontend")
    parts = assemble(settings)
    router = parts.router
    on_start, on_stop = [*parts.on_start, freeze_heap], parts.on_stop
    app = build_app(router, max_body_bytes=settings.max_body_bytes, strip_patterns=settings.strip_prompt_pattern,
                    on_start=on_start, on_stop=on_stop, telemetry=telemetry)
    install_operations(app, router, strip_patterns=settings.strip_prompt_pattern,
                       kvd_socket_path=settings.kvd_socket_path, enable_profiling=settings.enable_profiling,
                       profile_timeout=settings.profile_timeout, admin_token=settings.admin_token)
    if settings.router_mode == "direct" and settings.direct_default_worker:
        app.add_middleware(DefaultWorkerHeader, worker=settings.direct_default_worker)
    return app


def server_for(app: ASGIApp, settings: ServerSettings) -> DrainingServer:
    """uvicorn with the client deadlines (server/deadlines.py), --keep-alive-timeout, the inference POSTs'
    lean path past the ASGI stack (server/lean.py) and, on SIGTERM, a graceful drain (server/drain.py).
    No proxy-headers middleware: nothing here reads the client's
    address, and the spec has no trusted-proxy flag, so rewriting it per request would be pure cost."""
    drain = DrainState()
    protocol = with_lean(with_deadlines(settings.client_header_timeout, settings.client_body_timeout),
                         LeanPath.of(app, drain))
    config = uvicorn.Config(DrainMiddleware(app, drain), host=settings.host, port=settings.port, loop="uvloop",
                            http=protocol, log_level="warning", access_log=False, proxy_headers=False,
                            timeout_keep_alive=settings.keep_alive_timeout)
    return DrainingServer(config, drain, settings.drain_seconds)


def serve(app: FastAPI, settings: ServerSettings, sock: socket.socket | None = None) -> int:
    """Serve ``app`` on ``sock`` (a listening socket, one of --workers), else on --host:--port; returns at
    shutdown."""
    server = server_for(app, settings)
    server.run(sockets=[sock] if sock is not None else None)
    return 0 if server.started else STARTUP_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    settings = load(ServerSettings, argv, prog="python -m infera.server",
                    description="infera frontend: OpenAI-compatible API and KV-aware router",
                    choices=registry_choices())
    configure_logging(settings.log_level, settings.log_format)
    if settings.workers > 1:
        try:
            socks = listen(settings.host, settings.port, settings.workers)
        except OSError as exc:
            print(f"infera.server: error: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
            return 2
        return supervise(socks, lambda sock: _build_and_serve(settings, sock))
    return _build_and_serve(settings, None)


def _build_and_serve(settings: ServerSettings, sock: socket.socket | None) -> int:
    try:
        app = build(settings)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"infera.server: error: {exc}", file=sys.stderr)
        return 2
    return serve(app, settings, sock)


if __name__ == "__main__":
    sys.exit(main())
