"""Pure builders for the Gateway API Inference Extension wiring of a fleet.

- an ``InferencePool`` (``inference.networking.k8s.io/v1``) selecting the fleet's mixed and decode
  pods, targeting their frontend sidecar port, with ``endpointPickerRef`` to the picker's Service;
- the endpoint picker, one of:
  - ``picker: infera`` (default): ``python -m infera.picker``, infera's own router (KV-aware, fed by
    the fleet's discovery and KV events) behind the ext_proc protocol, on the fleet's image and
    service account; it names the worker (and a PD pair's prefill worker) to the sidecar;
  - ``picker: stock``: GAIE's reference EPP with a scheduler profile (ConfigMap + ``--config-file``),
    the engines' metrics port and metric names, gRPC health under its service names, and its own
    ServiceAccount/Role (leases too when it runs more than one replica, for leader election);
- an ``HTTPRoute`` from the named Gateway to the pool, when ``spec.gaie.gatewayName`` is set.

The picker answers the gateway with the chosen endpoint (pod IP:port) in
``x-gateway-destination-endpoint``; the gateway sends the request to that pod's sidecar, which serves
it with its own worker unless ``x-worker-instance-id`` names another.
"""

from __future__ import annotations

from typing import Any

from infera.config.operator import render_env
from infera.config.picker import PickerSettings
from infera.operator.builders import (
    ENGINE_PORT,
    FLEET_LABEL,
    FRONTEND_PORT,
    GATEWAY_TARGET_LABEL,
    Owner,
    frontend_env,
    labels,
    meta,
    service_account,
)
from infera.operator.spec import FleetSpec

EPP_COMPONENT = "endpoint-picker"
EPP_GRPC_PORT = 9002
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
POOL_GROUP = "inference.networking.k8s.io"
EPP_CONFIG_FILE = "default-plugins.yaml"
EPP_CONFIG_DIR = "/config"

# The stock EPP's scheduler profile: GAIE's default scorers (queue, KV utilisation, approximate prefix).
STOCK_SCHEDULER = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
"""

# What each engine exports on its HTTP port's /metrics: (KV-cache usage 0..1, queued, running).
VLLM_METRICS = ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_requests_running")
ENGINE_METRICS: dict[str, tuple[str, str, str]] = {
    "vllm": VLLM_METRICS,
    "mock": VLLM_METRICS,  # the mock engine exports vLLM's names
    "atom": VLLM_METRICS,  # ATOM serves vLLM's metric names
    "sglang": ("sglang:token_usage", "sglang:num_queue_reqs", "sglang:num_running_reqs"),
}


def epp_name(owner: Owner) -> str:
    return f"{owner.name}-epp"


def epp_config_name(owner: Owner) -> str:
    return f"{owner.name}-epp-config"


def inference_pool(owner: Owner, spec: FleetSpec) -> dict[str, Any]:
    return {
        "apiVersion": f"{POOL_GROUP}/v1", "kind": "InferencePool",
        "metadata": meta(owner, owner.name, "inference-pool"),
        "spec": {
            "selector": {"matchLabels": {FLEET_LABEL: owner.name, GATEWAY_TARGET_LABEL: "true"}},
            "targetPorts": [{"number": FRONTEND_PORT}],
            "endpointPickerRef": {"kind": "Service", "name": epp_name(owner), "port": {"number": EPP_GRPC_PORT},
                                  "failureMode": spec.gaie.endpoint_picker.failure_mode},
        },
    }


def epp_rbac(owner: Owner, spec: FleetSpec) -> list[dict[str, Any]]:
    """The stock picker's identity: read pods and pools; with replicas > 1, hold the leader lease."""
    name = epp_name(owner)
    read = ["get", "list", "watch"]
    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
        {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives"], "verbs": read}]
    if spec.gaie.endpoint_picker.replicas > 1:
        rules.append({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]})
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(owner, name, EPP_COMPONENT)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(owner, name, EPP_COMPONENT),
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": meta(owner, name, EPP_COMPONENT),
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
    ]


def epp_config(owner: Owner) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(owner, epp_config_name(owner), EPP_COMPONENT),
            "data": {EPP_CONFIG_FILE: STOCK_SCHEDULER}}


def _deployment(owner: Owner, replicas: int, pod_spec: dict[str, Any], *, recreate: bool) -> dict[str, Any]:
    match = {FLEET_LABEL: owner.name, "app.kubernetes.io/component": EPP_COMPONENT}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(owner, epp_name(owner), EPP_COMPONENT),
        "spec": {
            "replicas": replicas,
            # One active stock picker at a time: its prefix-cache state is in memory (upstream's advice).
            **({"strategy": {"type": "Recreate"}} if recreate else {}),
            "selector": {"matchLabels": match},
            "template": {"metadata": {"labels": labels(owner, EPP_COMPONENT)}, "spec": pod_spec},
        },
    }


def picker_env(owner: Owner, spec: FleetSpec) -> list[dict[str, Any]]:
    """infera's picker: the standalone frontend's discovery, transport and router settings (the same env
    names: PickerSettings extends ServerSettings) in auto mode, and its own ports."""
    own = render_env(PickerSettings, {"router_tokenizer_path": spec.tokenizer_path or spec.model_path,
                                      "port": EPP_GRPC_PORT, "metrics_port": EPP_METRICS_PORT,
                                      "target_port": FRONTEND_PORT})
    skip = {e["name"] for e in own} | {"INFERA_PORT", "INFERA_ROUTER_MODE"}
    return [*(e for e in frontend_env(owner, spec, sidecar=False) if e["name"] not in skip), *own]


def infera_picker_deployment(owner: Owner, spec: FleetSpec) -> dict[str, Any]:
    picker = spec.gaie.endpoint_picker
    container: dict[str, Any] = {
        "name": "picker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "infera.picker"],
        "env": picker_env(owner, spec),
        "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        # It listens only once its tokenizer and fleet view are loaded (tens of seconds on a busy node):
        # liveness starts after the startup probe passes, or it would be restarted before it ever serves.
        "startupProbe": {"grpc": {"port": EPP_GRPC_PORT, "service": "liveness"}, "periodSeconds": 2,
                         "failureThreshold": 150},
        "livenessProbe": {"grpc": {"port": EPP_GRPC_PORT, "service": "liveness"}, "periodSeconds": 10},
        "readinessProbe": {"grpc": {"port": EPP_GRPC_PORT, "service": "readiness"}, "periodSeconds": 2},
    }
    if picker.args:
        container["args"] = list(picker.args)
    return _deployment(owner, picker.replicas, {"serviceAccountName": service_account(owner),
                                                "containers": [container]}, recreate=False)


def stock_epp_deployment(owner: Owner, spec: FleetSpec) -> dict[str, Any]:
    picker = spec.gaie.endpoint_picker
    kv_usage, queued, running = ENGINE_METRICS[spec.engine]
    args = ["--pool-name", owner.name, "--pool-namespace", owner.namespace, "--zap-encoder", "json",
            "--grpc-port", str(EPP_GRPC_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT),
            "--metrics-port", str(EPP_METRICS_PORT), "--config-file", f"{EPP_CONFIG_DIR}/{EPP_CONFIG_FILE}",
            # It scrapes the engine (the pool's target port is the sidecar, which exports no engine metrics).
            "--model-server-metrics-port", str(ENGINE_PORT), "--model-server-metrics-path", "/metrics",
            "--kv-cache-usage-percentage-metric", kv_usage, "--total-queued-requests-metric", queued,
            "--total-running-requests-metric", running, *picker.args]
    if picker.replicas > 1:
        args.append("--ha-enable-leader-election")

    def probe(service: str) -> dict[str, Any]:
        return {"grpc": {"port": EPP_HEALTH_PORT, "service": service}}

    container = {
        "name": "epp",
        "image": picker.image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": {**probe("liveness"), "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**probe("readiness"), "periodSeconds": 2},
        "volumeMounts": [{"name": "plugins-config", "mountPath": EPP_CONFIG_DIR, "readOnly": True}],
    }
    pod = {"serviceAccountName": epp_name(owner), "terminationGracePeriodSeconds": 130, "containers": [container],
           "volumes": [{"name": "plugins-config", "configMap": {"name": epp_config_name(owner)}}]}
    return _deployment(owner, picker.replicas, pod, recreate=True)


def epp_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(owner, epp_name(owner), EPP_COMPONENT),
        "spec": {"type": "ClusterIP",
                 "selector": {FLEET_LABEL: owner.name, "app.kubernetes.io/component": EPP_COMPONENT},
                 "ports": [{"name": "grpc-ext-proc", "port": EPP_GRPC_PORT, "protocol": "TCP",
                            "appProtocol": "http2"},
                           {"name": "http-metrics", "port": EPP_METRICS_PORT, "protocol": "TCP"}]},
    }


def http_route(owner: Owner, gateway: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": meta(owner, owner.name, "http-route"),
        "spec": {
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway}],
            "rules": [{"backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": owner.name}],
                       "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                       "timeouts": {"request": "300s"}}],
        },
    }


def gaie_objects(owner: Owner, spec: FleetSpec) -> list[dict[str, Any]]:
    objects = [inference_pool(owner, spec)]
    if spec.gaie.picker == "stock":
        objects += [*epp_rbac(owner, spec), epp_config(owner), stock_epp_deployment(owner, spec)]
    else:
        objects.append(infera_picker_deployment(owner, spec))
    objects.append(epp_service(owner))
    if spec.gaie.gateway_name:
        objects.append(http_route(owner, spec.gaie.gateway_name))
    return objects
