"""The InferaFleet custom resource's spec (``infera.ai/v1alpha1``), as the operator reads it.

Field names are the CRD's (camelCase aliases); defaults are the CRD's too, so a spec the API server
has defaulted and one read raw give the same model. ``crds/inferafleets.infera.ai.yaml`` is the
schema the API server enforces; tests keep the two in step.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "infera.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferaFleet"
PLURAL = "inferafleets"

Engine = Literal["sglang", "vllm", "atom", "mock"]
ROLES = ("mixed", "prefill", "decode")


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class KeyRef(_Model):
    name: str = Field(min_length=1)
    key: str = Field(min_length=1)
    optional: bool | None = None


class EnvSource(_Model):
    secret_key_ref: KeyRef | None = None
    config_map_key_ref: KeyRef | None = None


class EnvVar(_Model):
    name: str = Field(min_length=1)
    value: str = ""
    value_from: EnvSource | None = Field(default=None, description="a Secret's or ConfigMap's key, e.g. an API token")

    def manifest(self) -> dict[str, Any]:
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": self.value_from.model_dump(by_alias=True, exclude_none=True)}
        return {"name": self.name, "value": self.value}


class Pool(_Model):
    replicas: int = Field(default=1, ge=0)
    resources: dict[str, dict[str, int | str]] = Field(
        default_factory=dict, description="a container's resources: requests/limits, quantities as 2 or \"500m\"")
    engine_args: list[str] = Field(default_factory=list, description="extra engine flags")
    env: list[EnvVar] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    pod_template: dict[str, Any] = Field(
        default_factory=dict, description="a PodTemplateSpec merged over what the operator builds (containers, "
                                          "env, volumes and mounts by name): volumes with the model, affinity, ...")


class Pools(_Model):
    mixed: Pool | None = None
    prefill: Pool | None = None
    decode: Pool | None = None

    def items(self) -> list[tuple[str, Pool]]:
        return [(role, pool) for role in ROLES if (pool := getattr(self, role)) is not None]


class Router(_Model):
    mode: Literal["auto", "direct"] = "auto"
    policy: Literal["kv-aware", "round-robin"] = "kv-aware"
    kv_overlap_weight: float = Field(default=1.0, ge=0)
    frontend_replicas: int = Field(default=1, ge=0)


class Transport(_Model):
    discovery: Literal["kubernetes", "etcd"] = "kubernetes"
    request: Literal["http", "nats"] = "http"
    kv_events: Literal["zmq", "nats", "none"] = "zmq"
    nats_url: str = ""
    etcd_endpoint: str = ""


class EndpointPicker(_Model):
    image: str = Field(default="registry.k8s.io/gateway-api-inference-extension/epp:v1.0.1",
                       description="the stock picker's image (picker: stock); infera's picker runs the fleet's image")
    args: list[str] = Field(default_factory=list)
    replicas: int = Field(default=1, ge=1)
    failure_mode: Literal["FailClose", "FailOpen"] = "FailClose"


class Gaie(_Model):
    enabled: bool = False
    picker: Literal["infera", "stock"] = Field(default="infera", description="infera: infera's KV-aware router "
                                               "as the endpoint picker; stock: GAIE's reference EPP")
    endpoint_picker: EndpointPicker = Field(default_factory=EndpointPicker)
    gateway_name: str = ""


def _default_pools() -> Pools:
    return Pools(mixed=Pool())


class FleetSpec(_Model):
    model: str = Field(min_length=1, description="served model name")
    engine: Engine = "vllm"
    image: str = "infera:dev"  # what deploy/Dockerfile builds and scripts/kind-up loads
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    model_path: str = ""
    tokenizer_path: str = Field(default="", description="the router's tokenizer: a dir, or a model id in the "
                                                         "frontend's Hugging Face cache; empty = modelPath")
    tokenizer_revision: str = Field(default="main", description="revision of a model-id tokenizer_path")
    pools: Pools = Field(default_factory=_default_pools)
    router: Router = Field(default_factory=Router)
    transport: Transport = Field(default_factory=Transport)
    gaie: Gaie = Field(default_factory=Gaie)

    @classmethod
    def parse(cls, spec: dict[str, Any]) -> FleetSpec:
        return cls.model_validate(spec)
