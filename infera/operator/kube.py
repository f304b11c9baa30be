"""A small generic client over kubernetes-asyncio: get/list/apply/merge-patch/delete of any kind as dicts.

The typed API classes would need one code path per kind; the operator only needs these verbs
on a known set of kinds, so it speaks the REST paths directly through the same ApiClient (auth,
TLS and kubeconfig handling stay kubernetes-asyncio's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException


@dataclasses.dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str, name: str = "", sub: str = "") -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced and namespace:  # no namespace: the collection across all namespaces
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


KINDS = {k.kind: k for k in (
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("v1", "Service", "services"),
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Pod", "pods"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
    Kind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    Kind("infera.ai/v1alpha1", "InferaFleet", "inferafleets"),
)}

_JSON = {200: "object", 201: "object", 202: "object"}
FIELD_MANAGER = "infera-operator"


def kind_of(obj: dict[str, Any]) -> Kind:
    return KINDS[obj["kind"]]


class Kube:
    def __init__(self, client: ApiClient) -> None:
        self.client = client

    async def _call(self, method: str, path: str, *, body: Any = None, query: list[tuple[str, str]] | None = None,
                    content_type: str = "application/json") -> dict[str, Any]:
        result = await self.client.call_api(
            path, method, query_params=query or [], body=body,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            response_types_map=_JSON, auth_settings=["BearerToken"], _return_http_data_only=True)
        return cast(dict[str, Any], result or {})

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", kind.path(namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, kind: Kind, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        body = await self._call("GET", kind.path(namespace), query=query)
        return list(body.get("items") or [])

    async def apply(self, obj: dict[str, Any], manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply of the whole object as ``manager``, forcing ownership of every field it sets.

        The API server creates the object if needed, removes fields this manager applied before
        and no longer sends, and takes back fields another writer changed (a ``kubectl scale``,
        a hand edit): a controller's desired state wins, as with every built-in controller.
        """
        kind = kind_of(obj)
        meta = obj["metadata"]
        return await self._call("PATCH", kind.path(meta.get("namespace", ""), meta["name"]), body=obj,
                                query=[("fieldManager", manager), ("force", "true")],
                                content_type="application/apply-patch+yaml")

    async def patch(self, kind: Kind, namespace: str, name: str, patch: dict[str, Any], *,
                    status: bool = False) -> dict[str, Any]:
        """JSON merge patch (RFC 7386): maps merge, lists and scalars replace, null deletes."""
        return await self._call("PATCH", kind.path(namespace, name, "status" if status else ""), body=patch,
                                content_type="application/merge-patch+json")

    async def delete(self, kind: Kind, namespace: str, name: str) -> None:
        try:
            await self._call("DELETE", kind.path(namespace, name),
                             body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status != 404:
                raise
