"""``python -m infera.server``: wire config -> discovery -> transports -> index -> router -> app, and serve."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from infera.config import load
from infera.config.base import ConfigError
from infera.config.server import ServerSettings
from infera.discovery.base import FleetView
from infera.discovery.etcd import EtcdFleet
from infera.discovery.kubernetes import KubernetesFleet
from infera.discovery.static import StaticFleet
from infera.kv.index import PrefixIndex
from infera.kv.tokenizer import PromptRenderer
from infera.router.policies import POLICIES, selectable
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app, install_operations
from infera.server.nodelay import NoDelayHttpToolsProtocol
from infera.server.transport_match import TransportMatchedFleet
from infera.transport.base import KvEventSource, RequestTransport
from infera.transport.http import HttpTransport
from infera.transport.nats_events import NatsEventSource
from infera.transport.nats_requests import NatsRequestTransport
from infera.transport.zmq_events import ZmqEventSource

log = logging.getLogger("infera.server")

def check_available(settings: ServerSettings) -> None:
    """Fail fast, naming the one-box alternative, when a NATS transport has no broker to talk to."""
    for field in ("request_transport", "kv_event_transport"):
        if getattr(settings, field) == "nats" and not settings.nats_server:
            flag = "--" + field.replace("_", "-")
            raise ConfigError(
                f"{flag} nats needs the broker's address: --nats-server nats://HOST:4222 (env NATS_SERVER or "
                "NATS_URL). Without a broker, on one box use --discovery-backend static --worker-url URL "
                "--request-transport http --kv-event-transport zmq")


def static_fleet(settings: ServerSettings, transport: HttpTransport) -> FleetView:
    return StaticFleet(transport.get_json, settings.worker_url, settings.workers_file,
                       poll_interval=settings.worker_poll_interval)


def etcd_fleet(settings: ServerSettings, transport: HttpTransport) -> FleetView:
    return EtcdFleet(settings.etcd_endpoint)


def kubernetes_fleet(settings: ServerSettings, transport: HttpTransport) -> FleetView:
    return KubernetesFleet(settings.k8s_label_selector, settings.k8s_namespace, kubeconfig=settings.kubeconfig)


# One factory per --discovery-backend value; a new backend is one function and one line here.
FLEETS: dict[str, Callable[[ServerSettings, HttpTransport], FleetView]] = {
    "static": static_fleet,
    "etcd": etcd_fleet,
    "kubernetes": kubernetes_fleet,
}


def http_requests(settings: ServerSettings, transport: HttpTransport) -> RequestTransport:
    return transport


def nats_requests(settings: ServerSettings, transport: HttpTransport) -> RequestTransport:
    return NatsRequestTransport(settings.nats_server, idle_timeout=settings.nats_req_idle_timeout,
                                max_duration=settings.nats_req_max_duration,
                                max_pending=settings.nats_req_max_pending,
                                connect_timeout=settings.upstream_connect_timeout)


# One factory per --request-transport value (the HTTP client also serves discovery and health checks).
REQUEST_TRANSPORTS: dict[str, Callable[[ServerSettings, HttpTransport], RequestTransport]] = {
    "http": http_requests,
    "nats": nats_requests,
}

# One factory per --kv-event-transport value; "none" has none.
KV_EVENT_SOURCES: dict[str, Callable[[ServerSettings], KvEventSource]] = {
    "zmq": lambda settings: ZmqEventSource(),
    "nats": lambda settings: NatsEventSource(settings.nats_server, connect_timeout=settings.upstream_connect_timeout),
}


def registry_choices() -> dict[str, tuple[str, ...]]:
    """The server's flag choices, from the registries themselves (a test checks the config's lists agree)."""
    return {"router_policy": selectable(), "discovery_backend": tuple(FLEETS),
            "request_transport": tuple(REQUEST_TRANSPORTS), "kv_event_transport": (*KV_EVENT_SOURCES, "none")}


class DefaultWorkerHeader:
    """Direct mode: a request naming no worker in x-worker-instance-id goes to ``worker``.

    The frontend sidecar of a worker pod runs with its own pod's worker here: a stock GAIE endpoint
    picker names the pod (by address), not the worker, so a request it sends to the pod must be
    served by that pod's worker.
    """

    def __init__(self, app: ASGIApp, worker: str) -> None:
        self.app = app
        self.header = (b"x-worker-instance-id", worker.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not any(k == self.header[0] for k, _ in scope["headers"]):
            scope = {**scope, "headers": [*scope["headers"], self.header]}
        await self.app(scope, receive, send)


def build(settings: ServerSettings) -> FastAPI:
    check_available(settings)
    renderer = PromptRenderer.from_dir(settings.router_tokenizer_path) if settings.router_tokenizer_path else None
    http = HttpTransport(settings.upstream_connect_timeout, settings.upstream_first_byte_timeout)
    transport = REQUEST_TRANSPORTS[settings.request_transport](settings, http)
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
    # Only a policy that reads the prefix index needs the fleet's KV events (round-robin does not).
    wants_events = POLICIES[settings.router_policy].needs_tokens
    event_factory = KV_EVENT_SOURCES.get(settings.kv_event_transport) if wants_events else None
    events = event_factory(settings) if event_factory else None
    fleet = TransportMatchedFleet(FLEETS[settings.discovery_backend](settings, http), settings.request_transport,
                                  settings.kv_event_transport if events else None)
    router = Router(fleet, transport, events, renderer, options, index=index)
    transports = [http] if transport is http else [http, transport]
    on_start = [*(t.start for t in transports), *([events.start] if events else []), fleet.start, router.start]
    on_stop = [router.stop, fleet.stop, *([events.stop] if events else []), *(t.stop for t in reversed(transports))]
    app = build_app(router, max_body_bytes=settings.max_body_bytes, strip_patterns=settings.strip_prompt_pattern,
                    on_start=on_start, on_stop=on_stop)
    install_operations(app, router, strip_patterns=settings.strip_prompt_pattern,
                       kvd_socket_path=settings.kvd_socket_path, enable_profiling=settings.enable_profiling,
                       profile_timeout=settings.profile_timeout, admin_token=settings.admin_token)
    if settings.router_mode == "direct" and settings.direct_default_worker:
        app.add_middleware(DefaultWorkerHeader, worker=settings.direct_default_worker)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    settings = load(ServerSettings, argv, prog="python -m infera.server",
                    description="infera frontend: OpenAI-compatible API and KV-aware router",
                    choices=registry_choices())
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
