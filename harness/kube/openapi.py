"""The API server's OpenAPI documents, which clients download to validate manifests before they send them.

``/openapi/v3`` lists one document per group/version; each document holds the schemas of the built-in
kinds (from the JSON schemas kubernetes-validate ships for the newest Kubernetes it knows, turned back
into OpenAPI: ``$ref`` paths, nullable type lists) and, for a group/version a stored CRD serves, that
CRD's ``openAPIV3Schema`` under its group-version-kind. ``/openapi/v2`` answers an empty protobuf
document: clients use v3 when the server has it and only probe v2.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

from kubernetes_validate.utils import latest_version  # type: ignore[import-untyped]

V2_CONTENT_TYPE = "application/octet-stream"  # as the API server labels its protobuf v2 document


def _openapi(node: Any) -> Any:
    """JSON Schema (as kubernetes-validate stores it) -> OpenAPI v3 as the API server publishes it."""
    if isinstance(node, list):
        return [_openapi(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = value.replace("#/$defs/", "#/components/schemas/")
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            out[key] = types[0] if len(types) == 1 else value
        else:
            out[key] = _openapi(value)
    return out


class OpenApi:
    """Documents built once (the built-in schemas are ~2 MB of JSON) and served as encoded bytes."""

    def __init__(self) -> None:
        self._builtin: dict[str, Any] | None = None
        self._cache: dict[tuple[str, str], bytes] = {}

    def _schemas(self) -> dict[str, Any]:
        if self._builtin is None:
            folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{latest_version()}-local"
            raw = json.loads((folder / "_definitions.json").read_text(encoding="utf-8"))
            self._builtin = _openapi(raw["$defs"])
        return self._builtin

    @staticmethod
    def path(group: str, version: str) -> str:
        return f"apis/{group}/{version}" if group else f"api/{version}"

    def index(self, group_versions: Iterable[tuple[str, str]], tag: str) -> dict[str, Any]:
        """The v3 discovery document; ``tag`` changes when a CRD does (clients cache by the hash)."""
        digest = hashlib.sha256(tag.encode()).hexdigest()[:16].upper()
        return {"paths": {self.path(g, v): {"serverRelativeURL": f"/openapi/v3/{self.path(g, v)}?hash={digest}"}
                          for g, v in sorted(set(group_versions))}}

    def document(self, group: str, version: str, crds: list[dict[str, Any]], tag: str) -> bytes:
        """One group/version's document (JSON bytes), with the stored CRDs' schemas for it."""
        key = (self.path(group, version), tag)
        if key not in self._cache:
            schemas = dict(self._schemas())
            for definition in crds:
                spec = definition["spec"]
                served = next((v for v in spec["versions"] if v["name"] == version), None)
                schema = ((served or {}).get("schema") or {}).get("openAPIV3Schema")
                if spec["group"] == group and schema is not None:
                    name = f"{'.'.join(reversed(group.split('.')))}.{version}.{spec['names']['kind']}"
                    schemas[name] = {**schema, "x-kubernetes-group-version-kind": [
                        {"group": group, "version": version, "kind": spec["names"]["kind"]}]}
            doc = {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0-emulator"},
                   "paths": {}, "components": {"schemas": schemas}}
            self._cache[key] = json.dumps(doc).encode()
        return self._cache[key]
