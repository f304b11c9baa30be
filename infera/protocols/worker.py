"""The worker record: what a worker tells the fleet about itself.

One JSON object, the same everywhere it is published: served by an engine at
``GET /infera/worker``, stored in etcd at ``/infera/workers/<id>`` and in a pod
annotation. ``version`` lets readers refuse records they do not understand.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RECORD_VERSION = 1

Role = Literal["mixed", "prefill", "decode"]

# Engines whose prefill/decode workers take chat only as a text completion (record capability default).
CHAT_AS_COMPLETION_ENGINES = ("atom",)


class KvEventEndpoint(BaseModel):
    """Where a worker's engine publishes KV-cache events (vLLM's ZMQ wire format)."""

    model_config = ConfigDict(extra="ignore")

    endpoint: str = Field(description="ZMQ PUB endpoint, e.g. tcp://127.0.0.1:5557")
    replay_endpoint: str | None = Field(default=None, description="ZMQ ROUTER endpoint that resends by sequence number")
    topic: str = ""


class Capacity(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kv_blocks: int = Field(default=0, ge=0, description="KV-cache blocks on the device (0 = unknown)")
    max_num_seqs: int = Field(default=0, ge=0, description="max concurrently running sequences (0 = unknown)")


class WorkerRecord(BaseModel):
    """A worker as the router sees it; ``instance_id`` is unique across the fleet."""

    model_config = ConfigDict(extra="ignore")

    version: int = RECORD_VERSION
    instance_id: str
    model: str
    role: Role = "mixed"
    engine: str = "unknown"
    http_url: str = Field(description="base URL of the engine's HTTP API, without /v1")
    nats_subject: str | None = Field(default=None, description="NATS subject it takes requests on "
                                     "(infera.req.<id>); None = it serves over HTTP only")
    nats_kv_subject: str | None = Field(default=None, description="NATS subject its KV events are relayed to "
                                        "(infera.kv.events.<id>); None = none are (ZMQ only, if any)")
    kv_events: KvEventEndpoint | None = None
    kv_block_size: int = Field(default=16, gt=0, description="tokens per KV block")
    capacity: Capacity = Field(default_factory=Capacity)
    dp_rank: int = 0
    dp_size: int = 1
    connector: str | None = Field(default=None, description="PD connector: push (SGLang bootstrap) or pull (NIXL)")
    bootstrap_addr: str | None = None
    gateway_target: str | None = Field(default=None, description="ip:port a GAIE gateway sends this worker's "
                                       "requests to (its pod's frontend sidecar); None = the engine's host with "
                                       "the picker's --target-port")
    serves_chat: bool | None = Field(default=None, description="takes requests on /v1/chat/completions; False: "
                                     "chat only as a text completion (e.g. an ATOM prefill/decode worker, whose "
                                     "KV-transfer parameters go on /v1/completions only); absent: derived")

    @model_validator(mode="after")
    def _derive_capabilities(self) -> WorkerRecord:
        """Records from workers that predate a capability get it derived from their engine and role."""
        if self.serves_chat is None:
            self.serves_chat = not (self.engine in CHAT_AS_COMPLETION_ENGINES and self.role != "mixed")
        return self
