"""Settings of the mock engine (``python -m infera.engine.mock``).

The wrappers of real engines (``python -m infera.engine.sglang|vllm|atom``) take
:class:`infera.config.worker.WorkerSettings`; both share :class:`WorkerFleetSettings`.
"""

from __future__ import annotations

import dataclasses

from infera.config.base import ConfigError, option
from infera.config.worker import ROLES, WorkerFleetSettings

__all__ = ["ROLES", "MockEngineSettings"]

CONNECTORS = ("push", "pull")  # PD connectors: SGLang bootstrap (push), vLLM NIXL (pull)


@dataclasses.dataclass(frozen=True)
class MockEngineSettings(WorkerFleetSettings):
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(30000, "HTTP port; every other port (KV events, replay) is chosen free and advertised "
                              "at GET /infera/worker")
    model_path: str = option("", "local tokenizer dir (tokenizer.json + tokenizer_config.json); empty = a "
                                 "built-in byte-level tokenizer with a ChatML template")
    served_model_name: str = option("mock-model", "model name served at /v1/models and required in requests")
    instance_id: str = option("", "unique worker id; empty = mock-<host>-<port>")
    role: str = option("mixed", "worker role: mixed, or prefill/decode of a disaggregated pair (see --connector)",
                        choices=ROLES)
    block_size: int = option(16, "tokens per KV block")
    num_kv_blocks: int = option(4096, "KV-cache blocks on the simulated device")
    max_num_seqs: int = option(256, "max sequences in the running batch")
    max_num_batched_tokens: int = option(8192, "token budget per scheduler step (chunked prefill)")
    max_model_len: int = option(32768, "longest prompt + output, in tokens (400 above it)")
    speedup_ratio: float = option(1.0, "divide every simulated step time by this")
    prefill_quadratic: float = option(4.21e-7, "prefill ms = a*T^2 + b*T + c for T uncached tokens in a step")
    prefill_linear: float = option(0.0152, "prefill ms linear coefficient b")
    prefill_constant: float = option(16.5, "prefill ms constant c")
    decode_quadratic: float = option(-25.74, "decode step ms = a*u^2 + b*u + c, u = KV usage fraction")
    decode_linear: float = option(54.01, "decode step ms linear coefficient b")
    decode_constant: float = option(5.74, "decode step ms constant c")
    kv_events: bool = option(True, "publish KV-cache events over ZMQ (vLLM wire format)")
    kv_events_port: int = option(0, "ZMQ PUB port for KV events; 0 = a free port")
    kv_replay_port: int = option(0, "ZMQ ROUTER port for event replay; 0 = a free port")
    kv_events_topic: str = option("kv-events", "topic frame of every KV-event message")
    kv_events_host: str = option("", "address advertised for the event sockets; empty = --host (or "
                                     "127.0.0.1 when --host is 0.0.0.0)")
    seed: int = option(0, "seed of the deterministic output text")
    log_level: str = option("warning", "logging level", choices=("debug", "info", "warning", "error"))
    connector: str = option("pull", "PD connector of a prefill/decode worker: push (SGLang bootstrap "
                                    "host/port/room) or pull (vLLM NIXL kv_transfer_params)", choices=CONNECTORS)
    kv_transfer_ms_per_block: float = option(0.05, "decode worker: simulated ms to receive one KV block from "
                                                   "the prefill worker (divided by --speedup-ratio)")
    bootstrap_timeout: float = option(30.0, "push decode worker: seconds to wait for the prefill worker to "
                                            "finish the bootstrap room (then the request fails with 502)")
    engine_name: str = option("mock", "engine advertised in the worker record (e.g. atom, to stand in for an "
                                      "ATOM worker in PD tests)")
    host_kv_blocks: int = option(8192, "blocks of the simulated host-memory KV tier behind the device blocks "
                                       "(what kvd prewarm hints fill; medium CPU in KV events)")
    host_promote_ms_per_block: float = option(0.2, "simulated ms to promote one block from host memory to the "
                                                   "device (divided by --speedup-ratio)")
    kvd_socket_path: str = option("", "serve a kvd Unix socket here: prewarm hints for this worker pull their "
                                      "blocks through host memory onto the device; empty = none")
    profile_dir: str = option("", "where POST /stop_profile writes the profile window (a Chrome trace of "
                                  "scheduler steps); empty = the system temp dir")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_size <= 0 or self.num_kv_blocks <= 0:
            raise ConfigError("--block-size and --num-kv-blocks must be > 0")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ConfigError("--max-num-seqs and --max-num-batched-tokens must be > 0")
        if self.host_kv_blocks < 0 or self.host_promote_ms_per_block < 0:
            raise ConfigError("--host-kv-blocks and --host-promote-ms-per-block must be >= 0")
        if self.speedup_ratio <= 0:
            raise ConfigError("--speedup-ratio must be > 0")
