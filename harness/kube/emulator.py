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

This module is the HTTP front (routing, watches, the scale subresource, authentication and RBAC);
the rest lives beside it: :mod:`~harness.kube.resources` (what is served), :mod:`~harness.kube.store`
(objects, history and every write), :mod:`~harness.kube.selectors`, :mod:`~harness.kube.validation`,
:mod:`~harness.kube.discovery` with :mod:`~harness.kube.openapi`, and :mod:`~harness.kube.protobuf`
(the request bodies Go clients send in protobuf).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import yaml  # type: ignore[import-untyped]
from aiohttp import web

from harness.kube import discovery, protobuf, rbac, tables
from harness.kube.openapi import OpenApi
from harness.kube.resources import BY_PATH, CRD, NAMESPACE, RESOURCES, ApiError, Res
from harness.kube.store import TEST_MANAGER, Store, Watcher

__all__ = ["BY_PATH", "RESOURCES", "TEST_MANAGER", "ApiError", "Emulator", "Res"]


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


class Emulator(Store):
    """Start with ``with Emulator() as emu:``; ``emu.kubeconfig(path)`` points clients at it."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request served
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

    def _definition(self, name: str) -> dict[str, Any] | None:
        return self.objects.get((CRD, "", name))

    def pod_log(self, namespace: str, pod: str, container: str | None) -> str:
        """``kubectl logs``: nothing runs pods here (:class:`harness.kube.cluster.LocalCluster` does)."""
        return ""

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
            return web.json_response(discovery.group_list())
        if parts == ["version"]:
            return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulator"})
        if parts[:1] == ["openapi"]:
            crds = [o for (r, _, _), o in self.objects.items() if r is CRD]
            return discovery.openapi(self._openapi_docs, parts[1:], crds)
        if parts and parts[0] == "api":
            group, rest = "", parts[1:]
        elif parts and parts[0] == "apis" and len(parts) >= 2:
            group, rest = parts[1], parts[2:]
        else:
            raise ApiError(404, "NotFound", f"no route {request.path}")
        user = self._authenticate(request)
        if not rest:
            return web.json_response(discovery.group(group))
        version, rest = rest[0], rest[1:]
        if not rest:
            return web.json_response(discovery.resource_list(group, version, self._definition))
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
        w = Watcher(res, namespace, labels, fields, asyncio.Queue())
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
