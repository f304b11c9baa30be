"""Discovery: the API group list, each group, each group/version's resource list (with the short names
and subresources kubectl reads), and the OpenAPI documents (:mod:`harness.kube.openapi`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from harness.kube.openapi import V2_CONTENT_TYPE, OpenApi
from harness.kube.resources import RESOURCES, SHORT_NAMES, ApiError


def openapi(docs: OpenApi, parts: Sequence[str], crds: list[dict[str, Any]]) -> web.Response:
    """``/openapi/...``: ``parts`` after ``openapi``; ``crds`` the stored CRDs."""
    if parts == ["v2"]:
        return web.Response(body=b"", content_type=V2_CONTENT_TYPE)  # an empty document: use v3
    if parts[:1] != ["v3"]:
        raise ApiError(404, "NotFound", "no such OpenAPI document")
    tag = ",".join(sorted(o["metadata"]["resourceVersion"] for o in crds))
    if len(parts) == 1:
        return web.json_response(docs.index(((r.group, r.version) for r in RESOURCES), tag))
    rest = parts[1:]
    group, version = ("", rest[1]) if rest[0] == "api" and len(rest) == 2 else \
        (rest[1], rest[2]) if rest[0] == "apis" and len(rest) == 3 else ("?", "?")
    if (group, version) not in {(r.group, r.version) for r in RESOURCES}:
        raise ApiError(404, "NotFound", f"no OpenAPI document for {'/'.join(rest)}")
    body = docs.document(group, version, crds, tag)
    return web.Response(body=body, content_type="application/json")


def group_list() -> dict[str, Any]:
    groups: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group and r.version not in groups.setdefault(r.group, []):
            groups[r.group].append(r.version)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
         "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}} for g, vs in groups.items()]}

def group(name: str) -> dict[str, Any]:
    for g in group_list()["groups"]:
        if g["name"] == name:
            return {"kind": "APIGroup", "apiVersion": "v1", **g}
    raise ApiError(404, "NotFound", f"no group {name}")

def resource_list(group: str, version: str, definition_of: Callable[[str], dict[str, Any] | None]
                  ) -> dict[str, Any]:
    """``definition_of(name)``: the stored CRD of that name (its short names are served), or None."""
    resources = []
    for r in RESOURCES:
        if r.group == group and r.version == version:
            verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
            definition = definition_of(f"{r.plural}.{r.group}")
            short = ((definition or {}).get("spec", {}).get("names", {}).get("shortNames")
                     or SHORT_NAMES.get(r.plural, []))
            resources.append({"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                              "kind": r.kind, "verbs": verbs, "shortNames": short})
            if r.status:
                resources.append({"name": r.plural + "/status", "singularName": "", "namespaced": r.namespaced,
                                  "kind": r.kind, "verbs": ["get", "patch", "update"]})
            if r.scale:
                resources.append({"name": r.plural + "/scale", "singularName": "", "namespaced": r.namespaced,
                                  "group": "autoscaling", "version": "v1", "kind": "Scale",
                                  "verbs": ["get", "patch", "update"]})
    if not resources:
        raise ApiError(404, "NotFound", f"no {group}/{version}")
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": resources}
