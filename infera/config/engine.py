"""Settings of a worker: the mock engine, and (later) the sglang/vllm/atom wrappers."""

from __future__ import annotations

import dataclasses

from infera.config.base import ConfigError, option

ROLES = ("mixed", "prefill", "decode")


@dataclasses.dataclass(frozen=True)
class MockEngineSettings:
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(30000, "HTTP port; every other port (KV events, replay) is chosen free and advertised "
                              "at GET /infera/worker")
    model_path: str = option("", "local tokenizer dir (tokenizer.json + tokenizer_config.json); empty = a "
                                 "built-in byte-level tokenizer with a ChatML template")
    served_model_name: str = option("mock-model", "model name served at /v1/models and required in requests")
    instance_id: str = option("", "unique worker id; empty = mock-<host>-<port>")
    role: str = option("mixed", "worker role (prefill/decode: see the PD issue)", choices=ROLES)
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

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.num_kv_blocks <= 0:
            raise ConfigError("--block-size and --num-kv-blocks must be > 0")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ConfigError("--max-num-seqs and --max-num-batched-tokens must be > 0")
        if self.speedup_ratio <= 0:
            raise ConfigError("--speedup-ratio must be > 0")
