"""Settings of the frontend (``python -m infera.server``)."""

from __future__ import annotations

import dataclasses

from infera.config.base import ConfigError, option

DISCOVERY_BACKENDS = ("static", "etcd", "kubernetes")
REQUEST_TRANSPORTS = ("http", "nats")
KV_EVENT_TRANSPORTS = ("zmq", "nats", "none")
ROUTER_MODES = ("auto", "direct")
OTEL_EXPORTERS = ("none", "otlp", "console")
LOG_FORMATS = ("text", "json")
# kv-aware-busy: kv-aware with an occupancy weight that rises while the fleet computes prompts (a candidate);
# kv-aware-hold: kv-aware-busy crediting a prefix holder's queue with the time it has computed it (a candidate);
# kv-aware (the default) prices an eviction by how recently the evicted blocks were used; kv-aware-flat prices every
# evicted block alike (the default before; kv-aware-busy and kv-aware-hold build on it);
# kv-aware-cold: kv-aware pricing a prompt nothing caches by the wait for a worker's next step (a candidate);
# kv-aware-occupancy: kv-aware without its stay floor (the default before); kv-aware-eviction: without the
# occupancy term too; kv-aware-ttft: without the eviction term too; kv-aware-blocks: the cost before those;
# approx-prefix: sglang-router's cache_aware tree, for engines that publish no KV events
ROUTER_POLICIES = ("kv-aware", "round-robin", "kv-aware-busy", "kv-aware-hold", "kv-aware-flat", "kv-aware-cold",
                   "kv-aware-occupancy", "kv-aware-eviction", "kv-aware-ttft", "kv-aware-blocks", "approx-prefix")

# A per-request nonce that Claude Code puts in the first system block; left in, it makes every
# prompt unique at token 0 and defeats prefix caching on every engine.
BILLING_HEADER_PATTERN = r"(?m)^x-anthropic-billing-header:[^\n]*\n?"


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    host: str = option("0.0.0.0", "address to listen on")
    port: int = option(8000, "port to listen on")
    workers: int = option(1, "serving processes sharing --port (SO_REUSEPORT, Linux), one core each; every "
                             "process has its own fleet view, KV-event subscriptions and /metrics")
    router_mode: str = option("auto", "auto: pick in-process; direct: obey the x-worker-instance-id header",
                              choices=ROUTER_MODES)
    router_policy: str = option("kv-aware", "how auto mode scores workers", choices=ROUTER_POLICIES)
    router_tokenizer_path: str = option("", "tokenizer used to render and hash prompts (required for kv-aware): "
                                            "a folder with tokenizer.json + tokenizer_config.json, or a model "
                                            "id (Qwen/Qwen3-0.6B) found offline in the Hugging Face cache "
                                            "($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)")
    router_tokenizer_revision: str = option("main", "revision of a model-id --router-tokenizer-path in the Hugging "
                                                    "Face cache: a ref name (main, a branch or tag) or a commit hash")
    kv_overlap_weight: float = option(1.0, "kv-aware: weight of prefill work left after the cache credit "
                                           "against decode load already on the worker")
    router_temperature: float = option(0.0, "kv-aware: 0 picks the cheapest worker; >0 samples by softmax of "
                                            "-cost/temperature, spreading near-ties")
    request_max_retries: int = option(1, "retries on an alternate worker when a request fails before its "
                                         "first response byte; 0 fails fast")
    discovery_backend: str = option("kubernetes", "where the worker list comes from: kubernetes watches pods, etcd "
                                                  "leased keys; static is for one box without a cluster (the "
                                                  "workers given by --worker-url/--workers-file)",
                                    choices=DISCOVERY_BACKENDS)
    request_transport: str = option("nats", "how requests reach a worker", choices=REQUEST_TRANSPORTS)
    kv_event_transport: str = option("nats", "how KV-cache events reach the router", choices=KV_EVENT_TRANSPORTS)
    kv_event_zmtp: bool = option(True, "zmq KV events: read tcp:// publishers with infera's own ZMTP reader in the "
                                       "event loop's thread (no libzmq I/O thread waking per batch); off: through "
                                       "libzmq, as ipc:// and inproc:// always are")
    worker_url: tuple[str, ...] = option((), "static discovery: a worker's base URL (repeatable); its record "
                                              "is read from GET <url>/infera/worker")
    workers_file: str = option("", "static discovery: a JSON file listing worker URLs or records; watched "
                                   "for changes")
    etcd_endpoint: str = option("", "host:port of etcd (--discovery-backend etcd)")
    k8s_label_selector: str = option("app.kubernetes.io/component=infera-worker",
                                     "pod selector (--discovery-backend kubernetes)")
    k8s_namespace: str = option("", "namespace whose pods are watched (--discovery-backend kubernetes); empty = "
                                    "the pod's own (service-account) namespace, else default",
                                env=("INFERA_K8S_NAMESPACE", "POD_NAMESPACE"))
    kubeconfig: str = option("", "kubeconfig file for the Kubernetes API; empty = in-cluster config inside a "
                                 "pod, else $KUBECONFIG or ~/.kube/config", env=("INFERA_KUBECONFIG", "KUBECONFIG"))
    direct_default_worker: str = option("", "direct mode: the worker that serves a request naming none in "
                                            "x-worker-instance-id (a frontend sidecar's own pod's worker); empty = "
                                            "the policy picks")
    nats_server: str = option("", "NATS URL (--request-transport/--kv-event-transport nats)",
                              env=("NATS_SERVER", "NATS_URL"))
    nats_req_idle_timeout: float = option(900.0, "NATS requests: max seconds to wait for the next reply chunk "
                                                 "(reset per chunk); expiry -> 504 and a cancel to the worker; "
                                                 "0 = forever")
    nats_req_max_duration: float = option(0.0, "NATS requests: hard cap in seconds on a whole request; expiry -> "
                                               "504 and a cancel to the worker; 0 = off")
    nats_req_max_pending: int = option(0, "NATS requests: per-worker limit of requests in flight from this "
                                          "frontend; at the cap -> 429 (retried on another worker); 0 = off")
    max_body_bytes: int = option(8 * 1024 * 1024, "largest request body accepted (413 above it)")
    client_header_timeout: float = option(10.0, "seconds a client may take to send a request's headers (from the "
                                                "connection's opening, or the request's first byte on a kept-alive "
                                                "connection); past it the connection is closed; 0 = no limit")
    client_body_timeout: float = option(60.0, "seconds a client may take to send a request's body once its "
                                              "headers are in; past it a 408 and the connection closed; "
                                              "0 = no limit")
    keep_alive_timeout: int = option(75, "seconds an idle client connection is kept open for its next request; "
                                         "longer than client pools' and load balancers' idle timeouts (60 s is "
                                         "common), so a client never sends on a connection the server is closing")
    upstream_connect_timeout: float = option(5.0, "seconds to connect to a worker")
    upstream_first_byte_timeout: float = option(600.0, "HTTP requests: seconds to wait for a worker's first "
                                                       "response byte (then it counts as failed and may be "
                                                       "retried); over NATS --nats-req-idle-timeout governs "
                                                       "the first token too")
    upstream_idle_timeout: float = option(900.0, "HTTP requests: max seconds between two reads of a worker's "
                                                 "response (reset per chunk): expiry before the first byte "
                                                 "fails the worker (retried elsewhere), after it ends the "
                                                 "response with an error; over NATS --nats-req-idle-timeout "
                                                 "governs; 0 = forever")
    drain_seconds: float = option(10.0, "on SIGTERM: stop accepting connections, keep answering requests on open "
                                        "ones (with Connection: close; /health 503) and let in-flight requests "
                                        "finish for up to this many seconds, then cancel what is left")
    kv_events_stale_seconds: float = option(5.0, "a worker that was sent requests but published no KV event "
                                                 "for this long is treated as blind: the router predicts its "
                                                 "cache from its own decisions")
    strip_prompt_pattern: tuple[str, ...] = option(
        (BILLING_HEADER_PATTERN,),
        "regex removed from every prompt before routing and forwarding: per-request nonces defeat prefix "
        "caching (repeatable; pass '' to disable)")
    worker_poll_interval: float = option(2.0, "static discovery: seconds between worker health checks")
    log_level: str = option("info", "logging level", choices=("debug", "info", "warning", "error"))
    log_format: str = option("text", "log lines as text or as one JSON object each (the request line too)",
                             choices=LOG_FORMATS)
    log_requests: bool = option(False, "one structured line per request at completion: request and trace ids, "
                                       "model, worker(s), decision, overlap, TTFT, tokens, status")
    otel_exporter: str = option("none", "OpenTelemetry traces: none (off), otlp (to OTEL_EXPORTER_OTLP_ENDPOINT, "
                                        "sampled as OTEL_TRACES_SAMPLER says) or console (stdout)",
                                env=("INFERA_OTEL_EXPORTER", "OTEL_TRACES_EXPORTER"), choices=OTEL_EXPORTERS)
    admin_token: str = option("", "when set, /v1/admin/... and /v1/cache/prewarm need 'Authorization: Bearer "
                                  "<token>' (401 otherwise)", secret=True)
    enable_profiling: bool = option(False, "serve POST /v1/admin/profile/start|stop (403 without), fanned out "
                                           "to the workers' /start_profile and /stop_profile")
    profile_timeout: float = option(60.0, "seconds each worker may take to answer a profile start/stop (a "
                                          "stop flushes traces, which can be slow)")
    kvd_socket_path: str = option("", "Unix socket of the KV daemon (kvd) that takes POST /v1/cache/prewarm "
                                      "hints; empty = prewarm answers 503")

    def __post_init__(self) -> None:
        if self.router_policy != "round-robin" and self.router_mode == "auto" and not self.router_tokenizer_path:
            raise ConfigError(f"--router-tokenizer-path is required for --router-policy {self.router_policy} "
                              "(or pass --router-policy round-robin)")
        if self.discovery_backend == "static" and not (self.worker_url or self.workers_file):
            raise ConfigError("--discovery-backend static needs --worker-url (repeatable) or --workers-file")
        if self.discovery_backend == "etcd" and not self.etcd_endpoint:
            raise ConfigError("--discovery-backend etcd needs --etcd-endpoint host:port")
        if self.request_max_retries < 0:
            raise ConfigError("--request-max-retries must be >= 0")
        if self.kv_overlap_weight < 0:
            raise ConfigError("--kv-overlap-weight must be >= 0")
        if self.nats_req_idle_timeout < 0 or self.nats_req_max_duration < 0 or self.nats_req_max_pending < 0:
            raise ConfigError("--nats-req-idle-timeout, --nats-req-max-duration and --nats-req-max-pending "
                              "must be >= 0")
        if self.upstream_first_byte_timeout < 0 or self.upstream_idle_timeout < 0:
            raise ConfigError("--upstream-first-byte-timeout and --upstream-idle-timeout must be >= 0")
        if self.drain_seconds < 0:
            raise ConfigError("--drain-seconds must be >= 0")
        if self.keep_alive_timeout < 1:
            raise ConfigError("--keep-alive-timeout must be >= 1")
        if self.client_header_timeout < 0 or self.client_body_timeout < 0:
            raise ConfigError("--client-header-timeout and --client-body-timeout must be >= 0")
        if self.max_body_bytes <= 0:
            raise ConfigError("--max-body-bytes must be > 0")
        if self.workers < 1:
            raise ConfigError("--workers must be >= 1")
