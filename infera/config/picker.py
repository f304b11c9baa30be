"""Settings of the GAIE endpoint picker (``python -m infera.picker``).

It routes exactly like the frontend in auto mode, so it takes the frontend's discovery, transport
and router flags (same names, same env variables) and adds its own ports and protocol names.
"""

from __future__ import annotations

import dataclasses

from infera.config.base import ConfigError, option
from infera.config.server import ServerSettings


@dataclasses.dataclass(frozen=True)
class PickerSettings(ServerSettings):
    port: int = option(9002, "gRPC port of the ext_proc and grpc.health.v1 services (GAIE's EPP port)")
    metrics_port: int = option(9090, "HTTP port of Prometheus /metrics; 0 = none")
    target_port: int = option(0, "port of the gateway target (the frontend sidecar) on a worker's host, for "
                                 "workers whose record has no gateway_target; 0 = the engine's own port")
    fallback_endpoints: int = option(0, "endpoints after the picked one in x-gateway-destination-endpoint, for "
                                        "the proxy to retry on when the first fails before responding; needs a "
                                        "proxy that reads a list (Envoy's override_host policy, not ORIGINAL_DST); "
                                        "with fallbacks no x-worker-instance-id is sent: each pod's sidecar serves "
                                        "its own worker")
    destination_header: str = option("x-gateway-destination-endpoint", "header (and envoy.lb metadata key) "
                                     "that names the picked endpoint(s)")
    metadata_namespace: str = option("envoy.lb", "dynamic-metadata namespace of the picked endpoint(s)")
    subset_namespace: str = option("envoy.lb.subset_hint", "filter-metadata namespace where the proxy may "
                                   "pass x-gateway-destination-endpoint-subset")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.router_mode != "auto":
            raise ConfigError("the endpoint picker picks: --router-mode must be auto")
        if self.fallback_endpoints < 0:
            raise ConfigError("--fallback-endpoints must be >= 0")
