"""Build a router from settings: discovery -> transports -> index -> router, with their start/stop hooks.

One builder for every process that routes (the frontend and the endpoint picker), so both run the
same policy, index, topology and load accounting, fed by the same discovery and KV-event transports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from infera.config.base import ConfigError
from infera.config.server import ServerSettings
from infera.discovery.base import FleetView
from infera.discovery.etcd import EtcdFleet
from infera.discovery.kubernetes import KubernetesFleet
from infera.discovery.static import StaticFleet
from infera.discovery.transport_match import TransportMatchedFleet
from infera.kv.index import PrefixIndex
from infera.kv.tokenizer import PromptRenderer
from infera.router.policies import POLICIES
from infera.router.router import Router, RouterOptions
from infera.transport.base import KvEventSource, RequestTransport
from infera.transport.http import HttpTransport
from infera.transport.nats_events import NatsEventSource
from infera.transport.nats_requests import NatsRequestTransport
from infera.transport.zmq_events import ZmqEventSource

Hook = Callable[[], Awaitable[None]]


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
    "zmq": lambda settings: ZmqEventSource(zmtp=settings.kv_event_zmtp),
    "nats": lambda settings: NatsEventSource(settings.nats_server, connect_timeout=settings.upstream_connect_timeout),
}


@dataclasses.dataclass
class Assembly:
    """A router and the hooks that start (in order) and stop (in order) what feeds it."""

    router: Router
    http: HttpTransport
    on_start: list[Hook]
    on_stop: list[Hook]


def assemble(settings: ServerSettings) -> Assembly:
    check_available(settings)
    renderer = (PromptRenderer.from_dir(settings.router_tokenizer_path, revision=settings.router_tokenizer_revision)
                if settings.router_tokenizer_path else None)
    http = HttpTransport(settings.upstream_connect_timeout, settings.upstream_first_byte_timeout,
                         settings.upstream_idle_timeout)
    transport = REQUEST_TRANSPORTS[settings.request_transport](settings, http)
    options = RouterOptions(
        mode=settings.router_mode,
        policy=settings.router_policy,
        kv_overlap_weight=settings.kv_overlap_weight,
        temperature=settings.router_temperature,
        max_retries=settings.request_max_retries,
        events_stale_seconds=settings.kv_events_stale_seconds,
    )
    # Only a policy that reads the prefix index needs the fleet's KV events (round-robin does not).
    wants_events = POLICIES[settings.router_policy].needs_tokens
    if renderer is not None and wants_events:
        renderer.prime_plain_chats()  # the common chats' recipes now, not on their first requests (~0.7 ms each)
    event_factory = KV_EVENT_SOURCES.get(settings.kv_event_transport) if wants_events else None
    events = event_factory(settings) if event_factory else None
    fleet = TransportMatchedFleet(FLEETS[settings.discovery_backend](settings, http), settings.request_transport,
                                  settings.kv_event_transport if events else None)
    router = Router(fleet, transport, events, renderer, options, index=PrefixIndex())
    transports = [http] if transport is http else [http, transport]
    on_start: list[Hook] = [*(t.start for t in transports), *([events.start] if events else []), fleet.start,
                            router.start]
    on_stop: list[Hook] = [router.stop, fleet.stop, *([events.stop] if events else []),
                           *(t.stop for t in reversed(transports))]
    return Assembly(router, http, on_start, on_stop)
