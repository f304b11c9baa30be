"""Checking rendered manifests: kubernetes-validate (strict) for built-in kinds, the CRD's own schema for
InferaFleets, and the documented shape of GAIE/Gateway API objects (whose CRDs are not shipped here).

kubernetes-validate carries the OpenAPI schemas of Kubernetes' built-in kinds only; it has no schema
for custom resources. InferaFleets are checked against ``crds/`` with jsonschema (the structural
schema is JSON Schema plus ``x-kubernetes-*`` keywords, which jsonschema ignores; CEL rules are not
evaluated). InferencePool, HTTPRoute and Gateway are checked against the small strict schemas below, written
from the GAIE v1 and Gateway API v1 references (the fields we set, closed to anything else), since
their CRDs cannot be fetched on these machines.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import latest_version

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "inferafleets.infera.ai.yaml"
K8S_VERSION = latest_version()

_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_META = {"type": "object", "required": ["name"], "properties": {"name": _NAME}}
_PORT = {"type": "object", "required": ["number"], "additionalProperties": False,
         "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}
INFERENCE_POOL = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"}, "kind": {"const": "InferencePool"},
        "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False,
                 "required": ["selector", "targetPorts", "endpointPickerRef"],
                 "properties": {
                     "selector": {"type": "object", "additionalProperties": False, "required": ["matchLabels"],
                                  "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                                                 "additionalProperties": {"type": "string"}}}},
                     "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": _PORT},
                     "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                     "endpointPickerRef": {
                         "type": "object", "additionalProperties": False, "required": ["name"],
                         "properties": {"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
                                        "port": _PORT, "failureMode": {"enum": ["FailOpen", "FailClose"]}}}}}},
}
HTTP_ROUTE = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"}, "kind": {"const": "HTTPRoute"},
        "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False, "properties": {
            "parentRefs": {"type": "array", "items": {
                "type": "object", "required": ["name"], "additionalProperties": False,
                "properties": {"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
                               "namespace": {"type": "string"}, "sectionName": {"type": "string"}}}},
            "rules": {"type": "array", "items": {"type": "object", "additionalProperties": False, "properties": {
                "backendRefs": {"type": "array", "items": {
                    "type": "object", "required": ["name"], "additionalProperties": False,
                    "properties": {"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
                                   "port": {"type": "integer"}, "weight": {"type": "integer"}}}},
                "matches": {"type": "array"},
                "timeouts": {"type": "object", "additionalProperties": False,
                             "properties": {"request": {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"},
                                            "backendRequest": {"type": "string"}}}}}}}}},
}
GATEWAY = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"}, "kind": {"const": "Gateway"},
        "metadata": _META,
        "spec": {"type": "object", "additionalProperties": False, "required": ["gatewayClassName", "listeners"],
                 "properties": {
                     "gatewayClassName": _NAME,
                     "listeners": {"type": "array", "minItems": 1, "maxItems": 64, "items": {
                         "type": "object", "required": ["name", "protocol", "port"], "additionalProperties": False,
                         "properties": {"name": _NAME, "hostname": {"type": "string"},
                                        "protocol": {"type": "string"}, "allowedRoutes": {"type": "object"},
                                        "port": {"type": "integer", "minimum": 1, "maximum": 65535}}}}}}},
}
CUSTOM = {"InferencePool": INFERENCE_POOL, "HTTPRoute": HTTP_ROUTE, "Gateway": GATEWAY}


def crd() -> dict[str, Any]:
    return dict(yaml.safe_load(CRD_FILE.read_text(encoding="utf-8")))


def crd_schema() -> dict[str, Any]:
    return dict(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: fill absent properties that declare a default,
    recursing into objects (including defaults just filled in) and array items."""
    if isinstance(value, dict):
        out = dict(value)
        for key, sub in (schema.get("properties") or {}).items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = apply_defaults(sub, out[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in out:
                if key not in (schema.get("properties") or {}):
                    out[key] = apply_defaults(extra, out[key])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def validate(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` is not a valid manifest of its kind (see the module docstring for how)."""
    kind = obj["kind"]
    if kind == "InferaFleet":
        jsonschema.Draft7Validator(crd_schema()).validate(apply_defaults(crd_schema(), obj))
    elif kind in CUSTOM:
        jsonschema.Draft7Validator(CUSTOM[kind]).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
