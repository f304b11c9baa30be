"""Pure builders for the Gateway API Inference Extension wiring of a fleet.

- an ``InferencePool`` (``inference.networking.k8s.io/v1``) selecting the fleet's mixed and decode
  pods, targeting their frontend sidecar port, with ``endpointPickerRef`` to the picker's Service;
- the endpoint picker (EPP): ServiceAccount, Role (pods, inferencepools, inferenceobjectives: read),
  RoleBinding, Deployment (gRPC ext-proc on 9002, gRPC health on 9003, metrics on 9090) and Service;
- an ``HTTPRoute`` from the named Gateway to the pool, when ``spec.gaie.gatewayName`` is set.

The picker answers the gateway with the chosen endpoint (pod IP:port) in
``x-gateway-destination-endpoint``; the gateway sends the request to that pod's sidecar, which serves
it with its own worker unless ``x-worker-instance-id`` names another.
"""

from __future__ import annotations

from typing import Any

from infera.operator.builders import (
    FLEET_LABEL,
    FRONTEND_PORT,
    GATEWAY_TARGET_LABEL,
    Owner,
    labels,
    meta,
)
from infera.operator.spec import FleetSpec

EPP_COMPONENT = "endpoint-picker"
EPP_GRPC_PORT = 9002
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
POOL_GROUP = "inference.networking.k8s.io"


def epp_name(owner: Owner) -> str:
    return f"{owner.name}-epp"


def inference_pool(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": f"{POOL_GROUP}/v1", "kind": "InferencePool",
        "metadata": meta(owner, owner.name, "inference-pool"),
        "spec": {
            "selector": {"matchLabels": {FLEET_LABEL: owner.name, GATEWAY_TARGET_LABEL: "true"}},
            "targetPorts": [{"number": FRONTEND_PORT}],
            "endpointPickerRef": {"kind": "Service", "name": epp_name(owner), "port": {"number": EPP_GRPC_PORT},
                                  "failureMode": "FailClose"},
        },
    }


def epp_rbac(owner: Owner) -> list[dict[str, Any]]:
    name = epp_name(owner)
    read = ["get", "list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(owner, name, EPP_COMPONENT)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(owner, name, EPP_COMPONENT),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": read},
                   {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
                   {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives"],
                    "verbs": read}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": meta(owner, name, EPP_COMPONENT),
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
    ]


def epp_deployment(owner: Owner, spec: FleetSpec) -> dict[str, Any]:
    picker = spec.gaie.endpoint_picker
    name = epp_name(owner)
    match = {FLEET_LABEL: owner.name, "app.kubernetes.io/component": EPP_COMPONENT}
    grpc_probe = {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}}
    args = ["--pool-name", owner.name, "--pool-namespace", owner.namespace, "--zap-encoder", "json",
            "--grpc-port", str(EPP_GRPC_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT),
            "--metrics-port", str(EPP_METRICS_PORT), *picker.args]
    if picker.replicas > 1:
        args.append("--ha-enable-leader-election")
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(owner, name, EPP_COMPONENT),
        "spec": {
            "replicas": picker.replicas,
            # One active picker at a time: its prefix-cache state is in memory (upstream's advice).
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": labels(owner, EPP_COMPONENT)},
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": 130,
                    "containers": [{
                        "name": "epp",
                        "image": picker.image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": args,
                        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                        "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
                                  {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
                                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
                        "livenessProbe": {**grpc_probe, "initialDelaySeconds": 5, "periodSeconds": 10},
                        "readinessProbe": {**grpc_probe, "periodSeconds": 2},
                    }],
                },
            },
        },
    }


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
    objects = [inference_pool(owner), *epp_rbac(owner), epp_deployment(owner, spec), epp_service(owner)]
    if spec.gaie.gateway_name:
        objects.append(http_route(owner, spec.gaie.gateway_name))
    return objects
