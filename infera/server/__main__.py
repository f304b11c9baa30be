"""``python -m infera.server``: wire config -> discovery -> transports -> index -> router -> app, and serve."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence

import uvicorn
from fastapi import FastAPI

from infera.config import load
from infera.config.base import ConfigError
from infera.config.server import ServerSettings
from infera.discovery.base import FleetView
from infera.discovery.static import StaticFleet
from infera.kv.index import PrefixIndex
from infera.kv.tokenizer import PromptRenderer
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app
from infera.server.nodelay import NoDelayHttpToolsProtocol
from infera.transport.http import HttpTransport
from infera.transport.zmq_events import ZmqEventSource

log = logging.getLogger("infera.server")

NOT_YET = {
    ("discovery_backend", "etcd"): "etcd discovery",
    ("discovery_backend", "kubernetes"): "Kubernetes discovery",
    ("request_transport", "nats"): "the NATS request transport",
    ("kv_event_transport", "nats"): "the NATS KV-event transport",
}


def check_available(settings: ServerSettings) -> None:
    """Fail fast, naming the one-box alternative, for backends this build does not have yet."""
    for (field, value), what in NOT_YET.items():
        if getattr(settings, field) == value:
            flag = "--" + field.replace("_", "-")
            raise ConfigError(
                f"{flag} {value}: {what} is not available in this build yet. On one box use "
                "--discovery-backend static --worker-url URL --request-transport http --kv-event-transport zmq")


def static_fleet(settings: ServerSettings, transport: HttpTransport) -> FleetView:
    return StaticFleet(transport.get_json, settings.worker_url, settings.workers_file,
                       poll_interval=settings.worker_poll_interval)


# One factory per --discovery-backend value; a new backend is one function and one line here.
FLEETS: dict[str, Callable[[ServerSettings, HttpTransport], FleetView]] = {
    "static": static_fleet,
}


def build(settings: ServerSettings) -> FastAPI:
    check_available(settings)
    renderer = PromptRenderer.from_dir(settings.router_tokenizer_path) if settings.router_tokenizer_path else None
    transport = HttpTransport(settings.upstream_connect_timeout, settings.upstream_first_byte_timeout)
    fleet = FLEETS[settings.discovery_backend](settings, transport)
    index = PrefixIndex()
    options = RouterOptions(
        mode=settings.router_mode,
        policy=settings.router_policy,
        kv_overlap_weight=settings.kv_overlap_weight,
        temperature=settings.router_temperature,
        max_retries=settings.request_max_retries,
        first_byte_timeout=settings.upstream_first_byte_timeout,
        events_stale_seconds=settings.kv_events_stale_seconds,
    )
    events = ZmqEventSource() if settings.kv_event_transport == "zmq" else None
    router = Router(fleet, transport, events, renderer, options, index=index)
    on_start = [transport.start, *([events.start] if events else []), fleet.start, router.start]
    on_stop = [fleet.stop, *([events.stop] if events else []), transport.stop]
    return build_app(router, max_body_bytes=settings.max_body_bytes, strip_patterns=settings.strip_prompt_pattern,
                     on_start=on_start, on_stop=on_stop)


def main(argv: Sequence[str] | None = None) -> int:
    settings = load(ServerSettings, argv, prog="python -m infera.server",
                    description="infera frontend: OpenAI-compatible API and KV-aware router")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = build(settings)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"infera.server: error: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=settings.host, port=settings.port, loop="uvloop", http=NoDelayHttpToolsProtocol,
                log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
