"""Server-side apply and managed fields, as the API server does them, for the emulator.

Every write records which *field manager* owns which fields (``metadata.managedFields``, in the
``FieldsV1`` format real servers use). An **apply** (PATCH ``application/apply-patch+yaml``) says
"these are all the fields I want": fields it sets that another manager owns and that would change
are a 409 conflict unless ``force=true`` (then ownership moves to the applier); fields it applied
before and no longer sends are removed from the object when no other manager owns them; the rest
merges in. Any other write (create, PUT, merge/JSON patch) is an **update**: the fields whose value
it changed become its manager's and leave everyone else's.

Lists are atomic (replaced whole, owned as one field) except the associative lists named in
:data:`LIST_KEYS`, whose items merge by key as the real server's schemas say (containers by name,
owner references by uid, ...). That is the subset this project's manifests need.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterator
from typing import Any

Path = tuple[str, ...]  # "f:<field>" and 'k:{"<key>":<value>}' steps, as in FieldsV1

# Associative lists: the field name -> the key of its items (Kubernetes' x-kubernetes-list-map-keys).
LIST_KEYS = {
    "ownerReferences": "uid", "containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
    "volumeMounts": "mountPath", "ports": "containerPort", "conditions": "type", "tolerations": "key",
    "imagePullSecrets": "name",
}
# Service ports are keyed by port (container ports by containerPort): both are called "ports".
PORT_KEYS = ("containerPort", "port")
# Fields the server owns: never managed, never removed by an apply.
SERVER_FIELDS = {("f:apiVersion",), ("f:kind",), ("f:metadata", "f:name"), ("f:metadata", "f:namespace"),
                 ("f:metadata", "f:uid"), ("f:metadata", "f:resourceVersion"), ("f:metadata", "f:generation"),
                 ("f:metadata", "f:creationTimestamp"), ("f:metadata", "f:managedFields"),
                 ("f:metadata", "f:deletionTimestamp")}


class ApplyConflict(Exception):
    """An apply would change fields other managers own; ``conflicts`` names them."""

    def __init__(self, conflicts: list[tuple[str, str]]) -> None:
        self.conflicts = conflicts  # (manager, dotted field)
        super().__init__("; ".join(f'conflict with "{m}": {f}' for m, f in conflicts))


def _item_key(field: str, item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    key = next((k for k in PORT_KEYS if k in item), None) if field == "ports" else LIST_KEYS.get(field)
    if key is None or key not in item:
        return None
    return "k:" + json.dumps({key: item[key]}, separators=(",", ":"))


def _assoc(field: str, value: Any) -> bool:
    return (isinstance(value, list) and bool(value) and (field in LIST_KEYS or field == "ports")
            and all(_item_key(field, item) is not None for item in value))


def paths(obj: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every leaf field of ``obj`` (scalars, atomic lists, empty maps), associative items by key."""
    for name, value in obj.items():
        path = (*prefix, "f:" + name)
        if path in SERVER_FIELDS:
            continue
        if isinstance(value, dict) and value:
            yield from paths(value, path)
        elif _assoc(name, value):
            for item in value:
                item_path = (*path, _item_key(name, item) or "")
                yield item_path
                yield from paths(item, item_path)
        else:
            yield path


def _find(items: list[Any], field: str, step: str) -> int | None:
    for i, item in enumerate(items):
        if _item_key(field, item) == step:
            return i
    return None


_MISSING = object()


def get(obj: Any, path: Path) -> Any:
    node, field = obj, ""
    for depth, step in enumerate(path):
        if step.startswith("f:"):
            field = step[2:]
            if not isinstance(node, dict) or field not in node:
                return _MISSING
            node = node[field]
        else:
            if not isinstance(node, list):
                return _MISSING
            i = _find(node, field, step)
            if i is None:
                return _MISSING
            if depth == len(path) - 1:
                return "<item>"  # an item's presence, not its value
            node = node[i]
    return node


def remove(obj: Any, path: Path) -> None:
    """Delete one field (or list item) from ``obj``; missing parents are fine."""
    node, field = obj, ""
    for depth, step in enumerate(path):
        last = depth == len(path) - 1
        if step.startswith("f:"):
            field = step[2:]
            if not isinstance(node, dict) or field not in node:
                return
            if last:
                del node[field]
                return
            node = node[field]
        else:
            if not isinstance(node, list):
                return
            i = _find(node, field, step)
            if i is None:
                return
            if last:
                del node[i]
                return
            node = node[i]


def merge(base: Any, applied: Any, field: str = "") -> Any:
    """``applied`` over ``base``: maps merge, associative lists merge by key, the rest replaces."""
    if isinstance(base, dict) and isinstance(applied, dict):
        out = dict(base)
        for name, value in applied.items():
            out[name] = merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return out
    if _assoc(field, applied) and isinstance(base, list) and all(_item_key(field, i) for i in base):
        out_list = [copy.deepcopy(i) for i in base]
        for item in applied:
            i = _find(out_list, field, _item_key(field, item) or "")
            if i is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[i] = merge(out_list[i], item, field)
        return out_list
    return copy.deepcopy(applied)


# ------------------------------------------------------------------ managed fields

def to_fields_v1(owned: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(owned):
        node = tree
        for step in path:
            node = node.setdefault(step, {})
        if path and path[-1].startswith("k:"):
            node.setdefault(".", {})
    return tree


def from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    owned: set[Path] = set()
    for step, sub in tree.items():
        if step == ".":
            owned.add(prefix)
            continue
        path = (*prefix, step)
        if sub:
            owned |= from_fields_v1(sub, path)
        else:
            owned.add(path)
    return owned


def _managers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj.get("metadata", {}).get("managedFields") or [])


def _owned(entry: dict[str, Any]) -> set[Path]:
    return from_fields_v1(entry.get("fieldsV1") or {})


def _entry(manager: str, operation: str, api_version: str, owned: set[Path], subresource: str) -> dict[str, Any]:
    entry = {"manager": manager, "operation": operation, "apiVersion": api_version,
             "time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(owned)}
    if subresource:
        entry["subresource"] = subresource
    return entry


def _set_managers(obj: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    kept = [e for e in entries if e.get("fieldsV1")]
    if kept:
        obj.setdefault("metadata", {})["managedFields"] = kept
    else:
        obj.get("metadata", {}).pop("managedFields", None)


def _dotted(path: Path) -> str:
    return ".".join(step[2:] if step.startswith("f:") else f"[{step[2:]}]" for step in path)


def apply(current: dict[str, Any] | None, applied: dict[str, Any], manager: str, *, force: bool,
          subresource: str = "") -> dict[str, Any]:
    """The object after ``manager`` applies ``applied`` to ``current`` (None: it does not exist yet)."""
    base = copy.deepcopy(current) if current is not None else {}
    entries = _managers(base)
    mine = next((e for e in entries if e["manager"] == manager and e["operation"] == "Apply"
                 and e.get("subresource", "") == subresource), None)
    before = _owned(mine) if mine else set()
    wanted = set(paths(applied))
    others = [(e, _owned(e)) for e in entries if e is not mine]
    conflicts: list[tuple[str, str]] = []
    taken: set[Path] = set()
    for path in wanted:
        if get(base, path) == get(applied, path):
            continue
        for entry, owned in others:
            if path in owned:
                conflicts.append((entry["manager"], _dotted(path)))
                taken.add(path)
    if conflicts and not force:
        raise ApplyConflict(sorted(set(conflicts)))
    still_owned = set().union(*(owned - taken for _, owned in others)) if others else set()
    for path in sorted(before - wanted, key=len, reverse=True):  # dropped fields, deepest first
        if path not in still_owned and not any(o[:len(path)] == path for o in still_owned):
            remove(base, path)
    merged = merge(base, applied)
    entry = _entry(manager, "Apply", applied.get("apiVersion", ""), wanted, subresource)
    if mine is not None and mine.get("fieldsV1") == entry["fieldsV1"]:
        entry["time"] = mine["time"]  # nothing changed hands: a no-op apply stays a no-op
    new_entries = [entry if e is mine else
                   (e if not (_owned(e) & taken) else {**e, "fieldsV1": to_fields_v1(_owned(e) - taken)})
                   for e in entries]
    if mine is None:
        new_entries.append(entry)
    _set_managers(merged, new_entries)
    return dict(merged)


def record_update(old: dict[str, Any] | None, new: dict[str, Any], manager: str, subresource: str = "") -> None:
    """Give ``manager`` the fields a non-apply write changed (in place on ``new``)."""
    old = old or {}
    entries = _managers(old)
    before, after = set(paths(old)), set(paths(new))
    changed = {p for p in after if get(old, p) != get(new, p)} | (before - after)
    if not changed:
        _set_managers(new, entries)
        return
    kept = [{**e, "fieldsV1": to_fields_v1(_owned(e) - changed)} for e in entries
            if not (e["manager"] == manager and e["operation"] == "Update")]
    mine = next((e for e in entries if e["manager"] == manager and e["operation"] == "Update"), None)
    owned = ((_owned(mine) if mine else set()) | (changed & after)) - (before - after)
    kept.append(_entry(manager, "Update", new.get("apiVersion", ""), owned, subresource))
    _set_managers(new, kept)
