"""Pure builders: an InferaFleet (owner + spec) -> the Kubernetes objects that should exist for it.

No I/O here. Every child carries the fleet's labels and a controller owner reference (so deleting
the fleet deletes it); ``reconcile`` server-side applies each one as a whole, so what a builder
leaves out is removed from the live object and a hand edit of what it sets is undone. Frontend and
worker settings are rendered through :func:`infera.config.operator.render_env` from the processes'
own settings schemas.

Topology:
- per pool (mixed/prefill/decode): a worker Deployment; its pods run ``python -m infera.engine.<engine>``
  with ``--discovery-backend kubernetes`` semantics (the wrapper annotates its own pod);
- GAIE off: a standalone frontend Deployment + Service (``router.mode``, usually auto);
- GAIE on: a frontend sidecar in every worker pod, in direct mode, defaulting to its own pod's worker
  (a stock endpoint picker names pods, not workers), plus the pool/picker objects of :mod:`.gaie`;
- the ServiceAccount/Role/RoleBinding that let workers annotate their pod and frontends watch pods.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from infera.config.engine import MockEngineSettings
from infera.config.operator import render_env
from infera.config.server import ServerSettings
from infera.config.worker import WorkerSettings
from infera.operator.overrides import merge
from infera.operator.spec import API_VERSION, KIND, FleetSpec, Pool

FLEET_LABEL = "infera.ai/fleet"
ROLE_LABEL = "infera.ai/role"
GATEWAY_TARGET_LABEL = "infera.ai/gateway-target"
COMPONENT = "app.kubernetes.io/component"
WORKER_COMPONENT = "infera-worker"
FRONTEND_COMPONENT = "infera-frontend"

ENGINE_PORT = 30000
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558
FRONTEND_PORT = 8000

# The settings schema of each engine's worker process: env names come from here, never typed by hand.
ENGINE_SETTINGS: dict[str, type[Any]] = {
    "mock": MockEngineSettings,
    "sglang": WorkerSettings,
    "vllm": WorkerSettings,
    "atom": WorkerSettings,
}

DOWNWARD_API = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
]


@dataclasses.dataclass(frozen=True)
class Owner:
    """The InferaFleet the children belong to."""

    name: str
    namespace: str
    uid: str


def labels(owner: Owner, component: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "infera", "app.kubernetes.io/instance": owner.name,
            "app.kubernetes.io/managed-by": "infera-operator", COMPONENT: component, FLEET_LABEL: owner.name,
            **extra}


def worker_selector(owner: Owner) -> str:
    """The pod selector the fleet's frontends watch (``--k8s-label-selector``)."""
    return f"{COMPONENT}={WORKER_COMPONENT},{FLEET_LABEL}={owner.name}"


def service_account(owner: Owner) -> str:
    return f"{owner.name}-infera"


def frontend_service(owner: Owner) -> str:
    return f"{owner.name}-frontend"


def pool_deployment(owner: Owner, role: str) -> str:
    return f"{owner.name}-{role}"


def meta(owner: Owner, name: str, component: str, **extra_labels: str) -> dict[str, Any]:
    return {"name": name, "namespace": owner.namespace, "labels": labels(owner, component, **extra_labels),
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": owner.name, "uid": owner.uid,
                                 "controller": True, "blockOwnerDeletion": True}]}


# ----------------------------------------------------------------------------- settings -> env

def worker_env(owner: Owner, spec: FleetSpec, role: str, pool: Pool) -> list[dict[str, Any]]:
    cls = ENGINE_SETTINGS[spec.engine]
    fields = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {
        "discovery_backend": spec.transport.discovery,
        "request_transport": spec.transport.request,
        "kv_event_transport": spec.transport.kv_events,
        "nats_server": spec.transport.nats_url,
        "etcd_endpoint": spec.transport.etcd_endpoint,
        "host": "0.0.0.0",
        "port": ENGINE_PORT,
        "model_path": spec.model_path,
        "served_model_name": spec.model,
        "instance_id": "$(POD_NAME)",
        "role": role,
        "kv_events_port": KV_EVENTS_PORT,
        "kv_replay_port": KV_REPLAY_PORT,
    }
    # the address routers reach this worker at: the pod IP
    values["advertise_host" if "advertise_host" in fields else "kv_events_host"] = "$(POD_IP)"
    if "engine_args" in fields and pool.engine_args:
        values["engine_args"] = shlex.join(pool.engine_args)
    return [*DOWNWARD_API, *render_env(cls, values)]


def frontend_env(owner: Owner, spec: FleetSpec, *, sidecar: bool) -> list[dict[str, Any]]:
    values: dict[str, Any] = {
        "host": "0.0.0.0",
        "port": FRONTEND_PORT,
        "router_mode": "direct" if sidecar else spec.router.mode,
        "router_policy": spec.router.policy,
        "router_tokenizer_path": spec.tokenizer_path or spec.model_path,  # a dir or a model id, as on the CLI
        "router_tokenizer_revision": spec.tokenizer_revision,
        "kv_overlap_weight": spec.router.kv_overlap_weight,
        "discovery_backend": spec.transport.discovery,
        "request_transport": spec.transport.request,
        "kv_event_transport": spec.transport.kv_events,
        "nats_server": spec.transport.nats_url,
        "etcd_endpoint": spec.transport.etcd_endpoint,
        "k8s_label_selector": worker_selector(owner),
        "k8s_namespace": "$(POD_NAMESPACE)",
    }
    if sidecar:
        values["direct_default_worker"] = "$(POD_NAME)"
    return [*DOWNWARD_API, *render_env(ServerSettings, values)]


def _merge_env(base: list[dict[str, Any]], user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {e["name"] for e in user}
    return [*(e for e in base if e["name"] not in names), *user]


# ----------------------------------------------------------------------------- containers

def frontend_container(owner: Owner, spec: FleetSpec, *, sidecar: bool) -> dict[str, Any]:
    port = {"name": "frontend", "containerPort": FRONTEND_PORT, "protocol": "TCP"}
    # A sidecar's readiness must not wait on the fleet: its own pod only joins the fleet once Ready.
    ready: dict[str, Any] = ({"tcpSocket": {"port": "frontend"}} if sidecar
                             else {"httpGet": {"path": "/health", "port": "frontend"}})
    return {
        "name": "frontend",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "infera.server"],
        "env": frontend_env(owner, spec, sidecar=sidecar),
        "ports": [port],
        "readinessProbe": {**ready, "periodSeconds": 2},
        # Loading the tokenizer takes seconds (tens on a busy node): liveness starts once it listens, and
        # asks /livez, not /health: a fleet still loading its models must not restart the frontend.
        "startupProbe": {"tcpSocket": {"port": "frontend"}, "periodSeconds": 2, "failureThreshold": 150},
        "livenessProbe": {"httpGet": {"path": "/livez", "port": "frontend"}, "periodSeconds": 10,
                          "failureThreshold": 3},
    }


def worker_container(owner: Owner, spec: FleetSpec, role: str, pool: Pool) -> dict[str, Any]:
    args = list(pool.engine_args) if spec.engine == "mock" else []
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", f"infera.engine.{spec.engine}"],
        "env": _merge_env(worker_env(owner, spec, role, pool), [e.manifest() for e in pool.env]),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"},
                  {"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
                  {"name": "kv-replay", "containerPort": KV_REPLAY_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2},
        # Engines load weights for minutes: liveness starts only after the startup probe passes.
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5,
                         "failureThreshold": 360},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                          "failureThreshold": 6},
    }
    if args:
        container["args"] = args
    if pool.resources:
        container["resources"] = pool.resources
    return container


# ----------------------------------------------------------------------------- objects

def rbac(owner: Owner) -> list[dict[str, Any]]:
    """Workers patch their own pod's annotation; frontends list and watch pods."""
    name = service_account(owner)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(owner, name, "rbac")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(owner, name, "rbac"),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(owner, name, "rbac"),
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
    ]


def worker_deployment(owner: Owner, spec: FleetSpec, role: str, pool: Pool) -> dict[str, Any]:
    extra = {ROLE_LABEL: role}
    if spec.gaie.enabled and role in ("mixed", "decode"):
        extra[GATEWAY_TARGET_LABEL] = "true"  # the gateway sends to mixed and decode pods, never prefill
    pod_labels = labels(owner, WORKER_COMPONENT, **extra)
    containers = [worker_container(owner, spec, role, pool)]
    if spec.gaie.enabled:
        containers.append(frontend_container(owner, spec, sidecar=True))
    pod: dict[str, Any] = {"serviceAccountName": service_account(owner), "containers": containers,
                           "terminationGracePeriodSeconds": 60}
    if pool.node_selector:
        pod["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        pod["tolerations"] = list(pool.tolerations)
    template = merge({"metadata": {"labels": pod_labels}, "spec": pod}, pool.pod_template)
    template["metadata"]["labels"] = {**template["metadata"].get("labels", {}), **pod_labels}  # the selector's own
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(owner, pool_deployment(owner, role), WORKER_COMPONENT, **extra),
        "spec": {
            "replicas": pool.replicas,
            "selector": {"matchLabels": {FLEET_LABEL: owner.name, COMPONENT: WORKER_COMPONENT, ROLE_LABEL: role}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": template,
        },
    }


def frontend_deployment(owner: Owner, spec: FleetSpec) -> dict[str, Any]:
    name = frontend_service(owner)
    match = {FLEET_LABEL: owner.name, COMPONENT: FRONTEND_COMPONENT}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(owner, name, FRONTEND_COMPONENT),
        "spec": {
            "replicas": spec.router.frontend_replicas,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": labels(owner, FRONTEND_COMPONENT)},
                "spec": {"serviceAccountName": service_account(owner),
                         "containers": [frontend_container(owner, spec, sidecar=False)]},
            },
        },
    }


def frontend_service_object(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(owner, frontend_service(owner), FRONTEND_COMPONENT),
        "spec": {"type": "ClusterIP", "selector": {FLEET_LABEL: owner.name, COMPONENT: FRONTEND_COMPONENT},
                 "ports": [{"name": "http", "port": FRONTEND_PORT, "targetPort": "frontend", "protocol": "TCP"}]},
    }
