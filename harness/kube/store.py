"""The API server's store: objects by (resource, namespace, name), resourceVersions from one global
counter, the history that watches replay, and the writes (create, replace, merge/JSON patch, server-side
apply, delete with finalizers and owner-reference garbage collection) with the server-set metadata,
admission and the status subresource split they imply. No HTTP here (:mod:`harness.kube.emulator`)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import jsonpatch

from harness.kube import crd, ssa
from harness.kube.resources import CRD, NAMESPACE, RESOURCES, ApiError, Res
from harness.kube.selectors import field_match, label_match
from harness.kube.validation import immutable, invalid_labels, invalid_name

HISTORY = 1000  # events kept for watch replay; older resourceVersions get 410 Gone


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


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class Watcher:
    res: Res
    namespace: str | None
    labels: str
    fields: str
    queue: asyncio.Queue[dict[str, Any] | None]


class Store:
    """The objects and their history; every method runs on one thread (the emulator's event loop)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[Res, str, str], dict[str, Any]] = {}  # (res, namespace, name) -> object
        self.rv = 100
        # (rv, res, type, object, object before)
        self.history: list[tuple[int, Res, str, dict[str, Any], dict[str, Any] | None]] = []
        self.compacted = 0  # resourceVersions at or below this are gone (410)
        self.watchers: list[Watcher] = []
        self.deleted_uids: set[str] = set()  # owners gone: a dependent created later is collected at once

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

    def _event_for(self, w: Watcher, kind: str, obj: dict[str, Any],
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
        problem = invalid_name(res, name) or invalid_labels(meta.get("labels") or {})
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
        problem = invalid_labels(meta.get("labels") or {}) or immutable(res, old, new)
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
