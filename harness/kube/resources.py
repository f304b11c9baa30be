"""What the API server serves: the resources (group, version, plural, kind, scope, subresources), and
the error it answers with (a ``Status`` object)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Res:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = False  # has the status subresource
    scale: bool = False  # has the scale subresource (spec.replicas as an autoscaling/v1 Scale)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = [
    Res("", "v1", "pods", "Pod", status=True),
    Res("", "v1", "services", "Service", status=True),
    Res("", "v1", "serviceaccounts", "ServiceAccount"),
    Res("", "v1", "configmaps", "ConfigMap"),
    Res("", "v1", "secrets", "Secret"),
    Res("", "v1", "events", "Event"),
    Res("", "v1", "namespaces", "Namespace", namespaced=False),
    Res("events.k8s.io", "v1", "events", "Event"),
    Res("apps", "v1", "deployments", "Deployment", status=True, scale=True),
    Res("apps", "v1", "replicasets", "ReplicaSet", status=True),  # served, but no controller makes any
    Res("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Res("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Res("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Res("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    Res("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False,
        status=True),
    Res("infera.ai", "v1alpha1", "inferafleets", "InferaFleet", status=True),
    Res("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool", status=True),
    Res("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute", status=True),
    Res("gateway.networking.k8s.io", "v1", "gateways", "Gateway", status=True),
]
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
SHORT_NAMES = {"pods": ["po"], "services": ["svc"], "serviceaccounts": ["sa"], "configmaps": ["cm"],
               "namespaces": ["ns"], "deployments": ["deploy"], "replicasets": ["rs"],
               "customresourcedefinitions": ["crd", "crds"], "events": ["ev"], "inferencepools": ["infpool"],
               "gateways": ["gtw"]}
NAMESPACE = BY_PATH[("", "v1", "namespaces")]
CRD = BY_PATH[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
