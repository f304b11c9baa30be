"""Settings of a worker process: the engine wrappers (``python -m infera.engine.sglang|vllm|atom``)
and, by inheritance of :class:`WorkerFleetSettings`, the mock engine.

The discovery and transport flags carry the same names, env vars, choices and defaults as the
server's (the reference's production plane: kubernetes, nats, nats), so a worker and a server
started with defaults meet, and one environment (``INFERA_DISCOVERY_BACKEND=etcd
INFERA_ETCD_ENDPOINT=...``) configures a whole box. A worker self-registers under ``etcd`` (a
leased key) or ``kubernetes`` (an annotation on its own pod); ``static`` publishes nothing, for
the one-box path where the frontend is given ``--worker-url`` and reads ``GET <url>/infera/worker``
(the demo, the tests and the benchmarks pass ``--discovery-backend static --request-transport http
--kv-event-transport zmq`` explicitly).
"""

from __future__ import annotations

import dataclasses

from infera.config.base import ConfigError, option
from infera.config.server import DISCOVERY_BACKENDS, KV_EVENT_TRANSPORTS, OTEL_EXPORTERS, REQUEST_TRANSPORTS

ROLES = ("mixed", "prefill", "decode")


@dataclasses.dataclass(frozen=True)
class WorkerFleetSettings:
    """How a worker joins the fleet; shared by every worker kind."""

    discovery_backend: str = option("kubernetes", "how routers find this worker: kubernetes annotates its own pod; "
                                                  "etcd registers it under a lease; static publishes nothing, for "
                                                  "one box where the frontend is given --worker-url and reads GET "
                                                  "/infera/worker", choices=DISCOVERY_BACKENDS)
    etcd_endpoint: str = option("", "host:port of etcd (--discovery-backend etcd)")
    kubeconfig: str = option("", "kubeconfig file for the Kubernetes API (--discovery-backend kubernetes: the worker "
                                 "annotates its own pod, named by POD_NAME/POD_NAMESPACE); empty = in-cluster "
                                 "config inside a pod, else $KUBECONFIG or ~/.kube/config",
                             env=("INFERA_KUBECONFIG", "KUBECONFIG"))
    request_transport: str = option("nats", "how requests reach this worker", choices=REQUEST_TRANSPORTS)
    kv_event_transport: str = option("nats", "how KV-cache events leave this worker (none: no events)",
                                     choices=KV_EVENT_TRANSPORTS)
    nats_server: str = option("", "NATS URL (--request-transport/--kv-event-transport nats)",
                              env=("NATS_SERVER", "NATS_URL"))
    otel_exporter: str = option("none", "OpenTelemetry traces of the NATS bridge: none (off), otlp (to "
                                        "OTEL_EXPORTER_OTLP_ENDPOINT) or console (stdout); each bridged request's "
                                        "span continues the frontend's leg", env=("INFERA_OTEL_EXPORTER",
                                                                                  "OTEL_TRACES_EXPORTER"),
                                choices=OTEL_EXPORTERS)
    lease_ttl: int = option(10, "etcd: seconds the record outlives this worker's last heartbeat (heartbeats "
                                "every TTL/3)")
    drain_seconds: float = option(10.0, "on SIGTERM: after deregistering, seconds to let in-flight requests "
                                        "finish before the engine is stopped")

    def __post_init__(self) -> None:
        if self.discovery_backend == "etcd" and not self.etcd_endpoint:
            raise ConfigError("--discovery-backend etcd needs --etcd-endpoint host:port")
        if self.lease_ttl < 2:
            raise ConfigError("--lease-ttl must be >= 2 seconds")
        if self.drain_seconds < 0:
            raise ConfigError("--drain-seconds must be >= 0")


@dataclasses.dataclass(frozen=True)
class WorkerSettings(WorkerFleetSettings):
    """A wrapper around a real engine (SGLang, vLLM, ATOM) that it launches or attaches to."""

    model_path: str = option("", "model dir or name given to the engine (required unless --engine-url)")
    served_model_name: str = option("", "model name served by the engine; empty = --model-path")
    host: str = option("127.0.0.1", "address the engine listens on")
    port: int = option(30000, "the engine's HTTP port")
    advertise_host: str = option("", "address routers use to reach the engine and its event sockets; empty = "
                                     "--host (127.0.0.1 when --host is 0.0.0.0)")
    engine_url: str = option("", "attach to an engine already serving at this base URL instead of launching one")
    engine_command: str = option("", "command that starts the engine (shell words); empty = the engine's "
                                     "module with this Python. Engine flags go after `--`")
    engine_args: str = option("", "extra engine flags (shell words), appended after the wrapper's")
    instance_id: str = option("", "unique worker id; empty = <engine>-<advertise host>-<port>")
    role: str = option("mixed", "worker role: mixed, or prefill/decode of a disaggregated pair (the engine is "
                                "started in that role and the record names its connector)", choices=ROLES)
    disaggregation_bootstrap_port: int = option(8998, "SGLang prefill worker: port of its KV bootstrap server, "
                                                      "passed to the engine and advertised in the record")
    block_size: int = option(0, "tokens per KV block: passed to the engine when > 0; 0 = the engine's own, "
                                "read from its info endpoints (else 16)")
    num_kv_blocks: int = option(0, "KV-cache blocks advertised as capacity; 0 = read from the engine (else unknown)")
    max_num_seqs: int = option(0, "max running sequences: passed to the engine and advertised when > 0")
    kv_events_port: int = option(0, "port the engine's KV-event PUB socket binds; 0 = a free port")
    kv_replay_port: int = option(0, "port of the engine's replay socket; 0 = a free port")
    kv_events_topic: str = option("kv-events", "topic frame of the engine's KV-event messages")
    health_timeout: float = option(900.0, "seconds to wait for the engine's /health after launch")
    log_level: str = option("info", "logging level", choices=("debug", "info", "warning", "error"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model_path and not self.engine_url:
            raise ConfigError("--model-path is required (or --engine-url to attach to a running engine)")
        if self.block_size < 0 or self.num_kv_blocks < 0 or self.max_num_seqs < 0:
            raise ConfigError("--block-size, --num-kv-blocks and --max-num-seqs must be >= 0")
