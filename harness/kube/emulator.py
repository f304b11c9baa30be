"""An in-memory Kubernetes API server, small and faithful enough for kubernetes-asyncio and kopf.

What it honours: namespaced and cluster-scoped collections for a fixed set of resources (core pods,
services, service accounts, config maps, events; apps deployments; rbac roles and bindings; the
InferaFleet, InferencePool, Gateway and HTTPRoute custom resources; CRDs), discovery documents, server-set
metadata (uid, resourceVersion from one global counter, creationTimestamp, generation bumped on spec
changes), label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!``), ``metadata.name``
/``metadata.namespace`` field selectors, optimistic concurrency on PUT, JSON merge patch (strategic
merge patch is treated as merge patch, which is exact for the maps this project patches), JSON
patch, server-side apply with managed fields per field manager (:mod:`harness.kube.ssa`: conflicts,
``force``, removal of fields a manager stopped applying), custom resources admitted through their stored
CRD's schema (:mod:`harness.kube.crd`: pruning, defaulting, validation, CEL rules), the scale subresource of Deployments
(``kubectl scale``), the status subresource (writes to the main resource keep status, writes to
``/status`` keep everything else), finalizers with deletionTimestamp, owner-reference garbage collection on delete,
and watches: from a resourceVersion (history replay), from nothing/"0" (synthetic ADDED for every
object), ``sendInitialEvents`` (a streaming list: the current objects, then the ``k8s.io/initial-events-end``
bookmark), objects entering or leaving a selector as ADDED/DELETED, ``timeoutSeconds``, bookmarks,
and 410 Gone as an ERROR event for a resourceVersion older than the compacted history.

It runs in its own thread with its own event loop, so sync tests and subprocesses can use it;
tests mutate it through thread-safe helpers. ``outage()`` makes it refuse connections.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jsonpatch
import yaml  # type: ignore[import-untyped]
from aiohttp import web

from harness.kube import crd, protobuf, rbac, ssa, tables
from harness.kube.openapi import V2_CONTENT_TYPE, OpenApi


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
HISTORY = 1000  # events kept for watch replay; older resourceVersions get 410 Gone


# ----------------------------------------------------------------------------- selectors

_SET = re.compile(r"^\s*([^\s!=,()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_match(selector: str, labels: dict[str, str]) -> bool:
    for term in _split_selector(selector or ""):
        m = _SET.match(term)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            ok = key in labels and labels[key] in values if op == "in" else labels.get(key) not in values
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def field_match(selector: str, obj: dict[str, Any]) -> bool:
    for term in _split_selector(selector or ""):
        negate = "!=" in term
        key, value = (s.strip() for s in term.replace("!=", "=").replace("==", "=").split("=", 1))
        node: Any = obj
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (str(node) == value) == negate:
            return False
    return True


# ----------------------------------------------------------------------------- merge patch

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


TEST_MANAGER = "emulator-test"  # the field manager of writes a test makes through the emulator's helpers


_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1035: Services
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _invalid_name(res: Res, name: str) -> str | None:
    if res.kind == "Service" and not _DNS_LABEL.match(name):
        return (f'metadata.name: Invalid value: "{name}": a DNS-1035 label must consist of lower case alphanumeric '
                "characters or '-', start with an alphabetic character, end with an alphanumeric character, and be "
                "at most 63 characters")
    if res.kind not in ("Service", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding") and \
            not _DNS_SUBDOMAIN.match(name):
        return f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain is required'
    return None


def _invalid_labels(labels: dict[str, str]) -> str | None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.match(prefix)) or not _LABEL_NAME.match(name):
            return f'metadata.labels: Invalid value: "{key}": a label key must be a qualified name'
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            return f'metadata.labels: Invalid value: "{value}": a label value must be at most 63 characters of ' \
                   "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric character"
    return None


def _immutable(res: Res, old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Fields the API server refuses to change after creation."""
    fields = {"Deployment": ("selector",), "Service": ("clusterIP",)}.get(res.kind, ())
    for field in fields:
        before, after = (old.get("spec") or {}).get(field), (new.get("spec") or {}).get(field)
        if before and after != before:
            return f"spec.{field}: Invalid value: {after!r}: field is immutable"
    return None


def _manager(request: web.Request) -> str:
    """The field manager of a write: ``?fieldManager=``, else the user agent's product, as the API server does."""
    explicit = request.query.get("fieldManager")
    if explicit:
        return explicit
    agent = request.headers.get("User-Agent", "")
    return agent.split("/", 1)[0] or "unknown"


async def _body(request: web.Request) -> Any:
    """A create or replace body: JSON, or protobuf for the kinds :mod:`harness.kube.protobuf` reads."""
    raw = await request.read()
    if request.headers.get("Content-Type", "").startswith(protobuf.CONTENT_TYPE):
        try:
            return protobuf.decode(raw)
        except (protobuf.ProtobufError, ValueError, UnicodeDecodeError) as exc:
            raise ApiError(415, "UnsupportedMediaType", str(exc)) from exc
    return json.loads(raw)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


@dataclasses.dataclass
class _Watcher:
    res: Res
    namespace: str | None
    labels: str
    fields: str
    queue: asyncio.Queue[dict[str, Any] | None]


class Emulator:
    """Start with ``with Emulator() as emu:``; ``emu.kubeconfig(path)`` points clients at it."""

    def __init__(self) -> None:
        self.objects: dict[tuple[Res, str, str], dict[str, Any]] = {}  # (res, namespace, name) -> object
        self.rv = 100
        # (rv, res, type, object, object before)
        self.history: list[tuple[int, Res, str, dict[str, Any], dict[str, Any] | None]] = []
        self.compacted = 0  # resourceVersions at or below this are gone (410)
        self.watchers: list[_Watcher] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request served
        self.deleted_uids: set[str] = set()  # owners gone: a dependent created later is collected at once
        self._openapi_docs = OpenApi()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._create(NAMESPACE, "", {"metadata": {"name": "default"}})
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="k8s-emulator", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("emulator did not start")

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()
        if not self.port:
            server = self._site._server
            assert isinstance(server, asyncio.base_events.Server)
            self.port = server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._loop is None:
            return
        async def shutdown() -> None:
            self._close_watches()
            assert self._runner is not None
            await self._runner.cleanup()
        self.call(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(5)
        self._loop = None

    def call(self, coro: Any) -> Any:
        """Run a coroutine on the emulator's loop and return its result (from any thread)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _sync(self, fn: Callable[[], Any]) -> Any:
        async def wrap() -> Any:
            return fn()
        return self.call(wrap())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path, namespace: str = "default", token: str = rbac.ADMIN_TOKEN) -> Path:
        """A kubeconfig for this server: the cluster admin, or who ``token`` names (:func:`rbac.sa_token`)."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emu",
            "clusters": [{"name": "emu", "cluster": {"server": self.url}}],
            "users": [{"name": "emu", "user": {"token": token}}],
            "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu", "namespace": namespace}}],
        }
        path.write_text(json.dumps(cfg), encoding="utf-8")  # JSON is YAML
        return path

    # ------------------------------------------------------------------ test controls (thread-safe)

    def outage(self) -> None:
        """Refuse connections and cut every open watch, until :meth:`recover`."""
        async def down() -> None:
            self._close_watches()
            assert self._site is not None
            await self._site.stop()
        self.call(down())

    def recover(self) -> None:
        self.call(self._listen())

    def expire_history(self) -> None:
        """Compact: every resourceVersion seen so far is now too old (410), and open watches end."""
        def do() -> None:
            self.compacted = self.rv
            self.history.clear()
            self._close_watches()
        self._sync(do)

    def end_watches(self) -> None:
        self._sync(self._close_watches)

    def create(self, obj: dict[str, Any], manager: str = TEST_MANAGER) -> dict[str, Any]:
        created: dict[str, Any] = self._sync(lambda: self._create(
            self._res_of(obj), obj.get("metadata", {}).get("namespace", ""), copy.deepcopy(obj), manager))
        return created

    def get(self, api_version: str, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        res = self._res_kind(api_version, kind)
        found = self._sync(lambda: self.objects.get((res, namespace if res.namespaced else "", name)))
        return copy.deepcopy(found) if found else None

    def list(self, api_version: str, kind: str, namespace: str | None = None, labels: str = "") -> list[dict[str, Any]]:
        res = self._res_kind(api_version, kind)
        found: list[dict[str, Any]] = self._sync(
            lambda: [copy.deepcopy(o) for o in self._select(res, namespace, labels, "")])
        return found

    def patch(self, api_version: str, kind: str, name: str, patch: dict[str, Any], namespace: str = "default",
              *, status: bool = False, manager: str = TEST_MANAGER) -> dict[str, Any]:
        """A merge patch by ``manager`` (an update: it takes the fields it changes, as ``kubectl edit`` would)."""
        res = self._res_kind(api_version, kind)
        ns = namespace if res.namespaced else ""
        patched: dict[str, Any] = self._sync(lambda: self._patch(res, ns, name, patch, "application/merge-patch+json",
                                                                 status or not res.status, manager))
        return patched

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "default") -> None:
        res = self._res_kind(api_version, kind)
        self._sync(lambda: self._delete(res, namespace if res.namespaced else "", name))

    def set_pod_ready(self, name: str, ready: bool, namespace: str = "default") -> None:
        status = "True" if ready else "False"
        self.patch("v1", "Pod", name, {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": status}, {"type": "ContainersReady", "status": status}]}},
            namespace, status=True)

    # ------------------------------------------------------------------ storage

    def _res_kind(self, api_version: str, kind: str) -> Res:
        for r in RESOURCES:
            if r.api_version == api_version and r.kind == kind:
                return r
        raise KeyError(f"{api_version} {kind}")

    def _res_of(self, obj: dict[str, Any]) -> Res:
        return self._res_kind(obj["apiVersion"], obj["kind"])

    def _select(self, res: Res, namespace: str | None, labels: str, fields: str) -> Iterator[dict[str, Any]]:
        for (r, ns, _), obj in sorted(self.objects.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            if r != res or (namespace is not None and ns != namespace):
                continue
            if label_match(labels, obj["metadata"].get("labels") or {}) and field_match(fields, obj):
                yield obj

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _record(self, res: Res, kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.history.append((rv, res, kind, copy.deepcopy(obj), copy.deepcopy(old)))
        if len(self.history) > HISTORY:
            dropped = self.history.pop(0)
            self.compacted = dropped[0]
        for w in list(self.watchers):
            event = self._event_for(w, kind, obj, old)
            if event is not None:
                w.queue.put_nowait(event)

    def _event_for(self, w: _Watcher, kind: str, obj: dict[str, Any],
                   old: dict[str, Any] | None) -> dict[str, Any] | None:
        if w.res.plural != self._res_of(obj).plural or w.res.group != self._res_of(obj).group:
            return None
        if w.namespace is not None and obj["metadata"].get("namespace", "") != w.namespace:
            return None
        def matches(o: dict[str, Any] | None) -> bool:
            return o is not None and label_match(w.labels, o["metadata"].get("labels") or {}) and \
                field_match(w.fields, o)
        now, before = matches(obj), matches(old)
        if kind == "DELETED":
            return {"type": "DELETED", "object": copy.deepcopy(obj)} if now else None
        if now and not before and kind == "MODIFIED":
            return {"type": "ADDED", "object": copy.deepcopy(obj)}
        if before and not now:
            return {"type": "DELETED", "object": copy.deepcopy(obj)}
        return {"type": kind, "object": copy.deepcopy(obj)} if now else None

    def _create(self, res: Res, namespace: str, obj: dict[str, Any], manager: str = TEST_MANAGER,
                applied: bool = False) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        ns = namespace if res.namespaced else ""
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        problem = _invalid_name(res, name) or _invalid_labels(meta.get("labels") or {})
        if problem:
            raise ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: {problem}')
        if (res, ns, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{res.plural} "{name}" already exists')
        if ns and (NAMESPACE, "", ns) not in self.objects:  # lenient: a namespace exists once used
            self._create(NAMESPACE, "", {"metadata": {"name": ns}})
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        if res.namespaced:
            meta["namespace"] = ns
        obj = self._admit(res, obj, None)
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion=self._bump(), generation=1)
        if not applied:
            ssa.record_update(None, obj, manager)
        if res.kind == "Pod" and "status" not in obj:
            obj["status"] = {"phase": "Pending"}
        if res is CRD:
            obj["status"] = crd.established(obj, meta["creationTimestamp"])
        self.objects[(res, ns, name)] = obj
        self._record(res, "ADDED", obj)
        refs = meta.get("ownerReferences") or []
        if refs and {r.get("uid") for r in refs} <= self.deleted_uids:
            # every owner was deleted (a controller's late write after its owner went): the garbage collector
            # removes the orphan, as the API server's does
            return self._delete(res, ns, name)
        return obj

    def _authenticate(self, request: web.Request) -> rbac.User:
        """The bearer token's user; none is the admin (kubectl sends no token over plain HTTP, like the
        insecure port API servers once had). Pods present their service account's token."""
        header = request.headers.get("Authorization", "")
        user = rbac.user_of(header[7:] if header.startswith("Bearer ") else rbac.ADMIN_TOKEN)
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    async def _authorize(self, user: rbac.User, request: web.Request, res: Res, ns: str, name: str,
                         sub: str) -> None:
        """RBAC: the verb on the resource (an apply that creates needs create too), and no escalation."""
        if user.admin:
            return
        listing = "watch" if request.query.get("watch") in ("true", "1") else "list"
        verb = {"GET": "get" if name else listing, "POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}.get(request.method, request.method.lower())
        authz = rbac.Authorizer(lambda kind: [o for (r, _, _), o in self.objects.items() if r.kind == kind])
        wants = [rbac.Request(verb, res.group, res.plural + (f"/{sub}" if sub else ""), ns, name)]
        if verb == "patch" and (res, ns, name) not in self.objects:
            wants.append(dataclasses.replace(wants[0], verb="create"))
        for want in wants:
            if not authz.allowed(user, want):
                where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
                group = f".{res.group}" if res.group else ""
                raise ApiError(403, "Forbidden", f'{res.plural}{group} "{name}" is forbidden: User "{user.name}" '
                                                 f'cannot {want.verb} resource "{want.resource}" in API group '
                                                 f'"{res.group}"{where}')
        if res.group == "rbac.authorization.k8s.io" and verb in ("create", "update", "patch"):
            body = yaml.safe_load(await request.read()) or {}
            obj = {**body, "kind": res.kind, "metadata": {**(body.get("metadata") or {}), "namespace": ns}}
            why = authz.escalation(user, obj, verb)
            if why:
                raise ApiError(403, "Forbidden", why)

    def pod_log(self, namespace: str, pod: str, container: str | None) -> str:
        """``kubectl logs``: nothing runs pods here (:class:`harness.kube.cluster.LocalCluster` does)."""
        return ""

    def _admit(self, res: Res, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """A custom resource whose CRD is stored here is pruned, defaulted and validated by its schema."""
        definition = self.objects.get((CRD, "", f"{res.plural}.{res.group}"))
        if definition is None:
            return obj
        version = next((v for v in definition["spec"]["versions"] if v["name"] == res.version), None)
        schema = ((version or {}).get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            return obj
        stored, errors = crd.admit(schema, obj, old)
        if errors:
            raise ApiError(422, "Invalid", f'{res.kind}.{res.group} "{obj["metadata"].get("name")}" is invalid: '
                                           + "; ".join(errors))
        return stored

    def _get(self, res: Res, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((res, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{res.plural}.{res.group} "{name}" not found')
        return obj

    def _store(self, res: Res, ns: str, old: dict[str, Any], new: dict[str, Any], status: bool,
               manager: str = TEST_MANAGER, applied: bool = False) -> dict[str, Any]:
        if res.status:  # the subresource split: each endpoint writes only its half
            if status:
                new = {**copy.deepcopy(old), "status": new.get("status")}
                if new["status"] is None:
                    new.pop("status")
            else:
                new = {**new}
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
        meta = new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "namespace", "name", "generation"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
        if "deletionTimestamp" in old["metadata"]:
            meta["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        new = self._admit(res, new, old)
        meta = new["metadata"]
        problem = _invalid_labels(meta.get("labels") or {}) or _immutable(res, old, new)
        if problem:
            raise ApiError(422, "Invalid", f'{res.kind} "{meta.get("name")}" is invalid: {problem}')
        if not applied:  # an apply has set managedFields itself
            meta["managedFields"] = copy.deepcopy(old["metadata"].get("managedFields") or [])
            ssa.record_update(old, new, manager, "status" if status and res.status else "")
        spec_keys = [k for k in new if k not in ("metadata", "status", "apiVersion", "kind")]
        if any(new.get(k) != old.get(k) for k in {*spec_keys, *(k for k in old if k not in (
                "metadata", "status", "apiVersion", "kind"))}):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        comparable_old = {**old, "metadata": {**old["metadata"], "resourceVersion": None}}
        comparable_new = {**new, "metadata": {**meta, "resourceVersion": None}}
        if comparable_old == comparable_new:
            return old  # a no-op write changes nothing, not even the resourceVersion
        meta["resourceVersion"] = self._bump()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects.pop((res, ns, meta["name"]), None)
            self._record(res, "DELETED", new, old)
            self._collect(meta["uid"])
            return new
        self.objects[(res, ns, meta["name"])] = new
        self._record(res, "MODIFIED", new, old)
        return new

    def _replace(self, res: Res, ns: str, name: str, body: dict[str, Any], status: bool,
                 manager: str = TEST_MANAGER) -> dict[str, Any]:
        old = self._get(res, ns, name)
        want = body.get("metadata", {}).get("resourceVersion")
        if want and want != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.plural} "{name}": the object '
                                            "has been modified; please apply your changes to the latest version")
        return self._store(res, ns, old, copy.deepcopy(body), status, manager)

    def _apply(self, res: Res, ns: str, name: str, body: Any, status: bool, manager: str,
               force: bool) -> dict[str, Any]:
        """Server-side apply: create the object, or merge what ``manager`` owns into it."""
        if not isinstance(body, dict) or not manager:
            raise ApiError(400, "BadRequest", "an apply needs an object body and a fieldManager")
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the request")
        old = self.objects.get((res, ns, name))
        try:
            new = ssa.apply(old, body, manager, force=force, subresource="status" if status and res.status else "")
        except ssa.ApplyConflict as exc:
            n = len(exc.conflicts)
            raise ApiError(409, "Conflict", f"Apply failed with {n} conflict{'s' if n > 1 else ''}: {exc}") from exc
        if old is None:
            new.setdefault("metadata", {})["name"] = name
            return self._create(res, ns, new, manager, applied=True)
        return self._store(res, ns, old, new, status, manager, applied=True)

    def _patch(self, res: Res, ns: str, name: str, patch: Any, ctype: str, status: bool,
               manager: str = TEST_MANAGER) -> dict[str, Any]:
        old = self._get(res, ns, name)
        if "json-patch" in ctype:
            new = jsonpatch.apply_patch(copy.deepcopy(old), patch)
        else:
            want = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
            if want and want != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'{res.plural} "{name}": the object has been modified')
            new = merge_patch(old, patch)
        return self._store(res, ns, old, new, status, manager)

    def _delete(self, res: Res, ns: str, name: str) -> dict[str, Any]:
        obj = self._get(res, ns, name)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(obj)
                new["metadata"]["deletionTimestamp"] = _now()
                new["metadata"]["resourceVersion"] = self._bump()
                self.objects[(res, ns, name)] = new
                self._record(res, "MODIFIED", new, obj)
                return new
            return obj
        del self.objects[(res, ns, name)]
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._bump()
        self._record(res, "DELETED", gone, obj)
        self._collect(obj["metadata"]["uid"])
        return gone

    def _collect(self, owner_uid: str) -> None:
        """Garbage collection: delete what the deleted object owned (background propagation)."""
        self.deleted_uids.add(owner_uid)
        for (res, ns, name), obj in list(self.objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == owner_uid for r in refs) and (res, ns, name) in self.objects:
                self._delete(res, ns, name)

    def _close_watches(self) -> None:
        for w in self.watchers:
            w.queue.put_nowait(None)
        self.watchers.clear()

    # ------------------------------------------------------------------ HTTP

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        try:
            return await self._route(request)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts == ["api"]:
            return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if parts == ["apis"]:
            return web.json_response(self._group_list())
        if parts == ["version"]:
            return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulator"})
        if parts[:1] == ["openapi"]:
            return self._openapi(parts[1:])
        if parts and parts[0] == "api":
            group, rest = "", parts[1:]
        elif parts and parts[0] == "apis" and len(parts) >= 2:
            group, rest = parts[1], parts[2:]
        else:
            raise ApiError(404, "NotFound", f"no route {request.path}")
        user = self._authenticate(request)
        if not rest:
            return web.json_response(self._group(group))
        version, rest = rest[0], rest[1:]
        if not rest:
            return web.json_response(self._resource_list(group, version))
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        res = BY_PATH.get((group, version, rest[0]))
        if res is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource {request.path}")
        ns = (namespace or "") if res.namespaced else ""
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub == "log" and res.kind == "Pod" and name is not None and request.method == "GET":
            self._get(res, ns, name)
            return web.Response(text=self.pod_log(ns, name, request.query.get("container")))
        if sub not in (None, "status", "scale") or (sub == "status" and not res.status) or (
                sub == "scale" and not res.scale):
            raise ApiError(404, "NotFound", f"no subresource {sub}")
        if sub == "scale" and name is not None:
            return await self._scale(request, res, ns, name)
        q = request.query
        method = request.method
        await self._authorize(user, request, res, ns, name or "", sub or "")
        if name is None:
            if method == "GET":
                if q.get("watch", "").lower() in ("true", "1"):
                    return await self._watch(request, res, namespace if res.namespaced else None)
                items = list(self._select(res, namespace if res.namespaced else None, q.get("labelSelector", ""),
                                          q.get("fieldSelector", "")))
                if "as=Table" in request.headers.get("Accept", ""):  # kubectl get
                    definition = self.objects.get((CRD, "", f"{res.plural}.{res.group}"))
                    columns = tables.printer_columns(definition, res.version) if definition is not None else None
                    return web.json_response(tables.table(res.kind, items, str(self.rv), columns))
                return web.json_response({"kind": res.kind + "List", "apiVersion": res.api_version,
                                          "metadata": {"resourceVersion": str(self.rv)}, "items": items})
            if method == "POST":
                body = await _body(request)
                body_ns = body.get("metadata", {}).get("namespace")
                if res.namespaced and body_ns and body_ns != ns:
                    raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
                return web.json_response(self._create(res, ns, body, _manager(request)), status=201)
            raise ApiError(405, "MethodNotAllowed", method)
        if method == "GET":
            return web.json_response(self._get(res, ns, name))
        if method == "PUT":
            return web.json_response(self._replace(res, ns, name, await _body(request), sub == "status",
                                                   _manager(request)))
        if method == "PATCH":
            ctype = request.headers.get("Content-Type", "application/merge-patch+json")
            status = sub == "status" or not res.status
            if ctype.startswith("application/apply-patch"):
                body = yaml.safe_load(await request.read())
                force = q.get("force", "").lower() in ("true", "1")
                return web.json_response(self._apply(res, ns, name, body, status, q.get("fieldManager", ""), force))
            body = json.loads(await request.read())
            return web.json_response(self._patch(res, ns, name, body, ctype, status, _manager(request)))
        if method == "DELETE":
            return web.json_response(self._delete(res, ns, name))
        raise ApiError(405, "MethodNotAllowed", method)

    async def _scale(self, request: web.Request, res: Res, ns: str, name: str) -> web.StreamResponse:
        """The scale subresource (``kubectl scale``): spec.replicas read and written as a Scale."""
        if request.method in ("PATCH", "PUT"):
            body = json.loads(await request.read())
            if "json-patch" in request.headers.get("Content-Type", ""):
                body = jsonpatch.apply_patch(self._scale_of(self._get(res, ns, name)), body)
            replicas = (body.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", "spec.replicas: must be a non-negative integer")
            self._patch(res, ns, name, {"spec": {"replicas": replicas}}, "application/merge-patch+json", False,
                        _manager(request))
        elif request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", request.method)
        return web.json_response(self._scale_of(self._get(res, ns, name)))

    @staticmethod
    def _scale_of(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        match = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
                "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 1)},
                "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                           "selector": ",".join(f"{k}={v}" for k, v in sorted(match.items()))}}

    async def _watch(self, request: web.Request, res: Res, namespace: str | None) -> web.StreamResponse:
        q = request.query
        rv = q.get("resourceVersion", "")
        labels, fields = q.get("labelSelector", ""), q.get("fieldSelector", "")
        timeout = float(q.get("timeoutSeconds", "1800"))
        bookmarks = q.get("allowWatchBookmarks", "").lower() in ("true", "1")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await resp.write(json.dumps(event).encode() + b"\n")

        if rv not in ("", "0") and int(rv) < self.compacted:
            await send({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                    "reason": "Expired", "code": 410,
                                                    "message": f"too old resource version: {rv} ({self.compacted})"}})
            return resp
        w = _Watcher(res, namespace, labels, fields, asyncio.Queue())
        initial = q.get("sendInitialEvents", "").lower() in ("true", "1")  # a streaming list (WatchList)
        if rv in ("", "0") or initial:
            for obj in list(self._select(res, namespace, labels, fields)):
                w.queue.put_nowait({"type": "ADDED", "object": copy.deepcopy(obj)})
            if initial:  # the end of the initial state, which the client waits for before it calls the list done
                w.queue.put_nowait({"type": "BOOKMARK", "object": {
                    "kind": res.kind, "apiVersion": res.api_version, "metadata": {
                        "resourceVersion": str(self.rv), "annotations": {"k8s.io/initial-events-end": "true"}}}})
        else:
            for hrv, hres, kind, obj, old in self.history:
                if hrv > int(rv) and hres == res:
                    event = self._event_for(w, kind, obj, old)
                    if event is not None:
                        w.queue.put_nowait(event)
        self.watchers.append(w)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    event = await asyncio.wait_for(w.queue.get(), min(left, 1.0))
                except TimeoutError:
                    if bookmarks:
                        await send({"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.api_version,
                                                                   "metadata": {"resourceVersion": str(self.rv)}}})
                    continue
                if event is None:
                    break
                await send(event)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            if w in self.watchers:
                self.watchers.remove(w)
        return resp

    # ------------------------------------------------------------------ discovery

    def _openapi(self, parts: Sequence[str]) -> web.Response:
        if parts == ["v2"]:
            return web.Response(body=b"", content_type=V2_CONTENT_TYPE)  # an empty document: use v3
        if parts[:1] != ["v3"]:
            raise ApiError(404, "NotFound", "no such OpenAPI document")
        crds = [o for (r, _, _), o in self.objects.items() if r is CRD]
        tag = ",".join(sorted(o["metadata"]["resourceVersion"] for o in crds))
        if len(parts) == 1:
            return web.json_response(self._openapi_docs.index(((r.group, r.version) for r in RESOURCES), tag))
        rest = parts[1:]
        group, version = ("", rest[1]) if rest[0] == "api" and len(rest) == 2 else \
            (rest[1], rest[2]) if rest[0] == "apis" and len(rest) == 3 else ("?", "?")
        if (group, version) not in {(r.group, r.version) for r in RESOURCES}:
            raise ApiError(404, "NotFound", f"no OpenAPI document for {'/'.join(rest)}")
        body = self._openapi_docs.document(group, version, crds, tag)
        return web.Response(body=body, content_type="application/json")

    def _group_list(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {}
        for r in RESOURCES:
            if r.group and r.version not in groups.setdefault(r.group, []):
                groups[r.group].append(r.version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}} for g, vs in groups.items()]}

    def _group(self, group: str) -> dict[str, Any]:
        for g in self._group_list()["groups"]:
            if g["name"] == group:
                return {"kind": "APIGroup", "apiVersion": "v1", **g}
        raise ApiError(404, "NotFound", f"no group {group}")

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = []
        for r in RESOURCES:
            if r.group == group and r.version == version:
                verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
                definition = self.objects.get((CRD, "", f"{r.plural}.{r.group}"))
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
