"""What ``kubectl get`` prints: the server-side Table of a list (meta.k8s.io/v1), with kubectl's columns.

Pods, Deployments and Services get the columns a real API server gives them (``-o wide`` adds the
priority-1 ones); a custom resource gets its CRD's ``additionalPrinterColumns`` (simple ``.a.b``
JSON paths); anything else Name and Age.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

Column = tuple[str, str, int, Callable[[dict[str, Any]], Any]]  # name, type, priority, cell


def _age(obj: dict[str, Any]) -> str:
    created = obj["metadata"].get("creationTimestamp")
    if not created:
        return "<unknown>"
    then = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    secs = int((datetime.datetime.now(datetime.UTC) - then).total_seconds())
    return f"{secs}s" if secs < 120 else f"{secs // 60}m" if secs < 7200 else f"{secs // 3600}h"


def _pod_status(pod: dict[str, Any]) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting:
            return str(waiting.get("reason", "Waiting"))
    return str((pod.get("status") or {}).get("phase", "Pending"))


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])


def _ports(svc: dict[str, Any]) -> str:
    return ",".join(f"{p['port']}/{p.get('protocol', 'TCP')}" for p in svc["spec"].get("ports") or []) or "<none>"


COLUMNS: dict[str, list[Column]] = {
    "Pod": [
        ("Ready", "string", 0, lambda p: f"{sum(c.get('ready', False) for c in _containers(p))}/"
                                         f"{len(p['spec'].get('containers') or [])}"),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "integer", 0, lambda p: sum(c.get("restartCount", 0) for c in _containers(p))),
        ("Age", "string", 0, _age),
        ("IP", "string", 1, lambda p: (p.get("status") or {}).get("podIP", "<none>")),
        ("Node", "string", 1, lambda p: p["spec"].get("nodeName") or "local"),
    ],
    "Deployment": [
        ("Ready", "string", 0, lambda d: f"{(d.get('status') or {}).get('readyReplicas', 0)}/"
                                         f"{d['spec'].get('replicas', 1)}"),
        ("Up-to-date", "integer", 0, lambda d: (d.get("status") or {}).get("updatedReplicas", 0)),
        ("Available", "integer", 0, lambda d: (d.get("status") or {}).get("availableReplicas", 0)),
        ("Age", "string", 0, _age),
    ],
    "Service": [
        ("Type", "string", 0, lambda s: s["spec"].get("type", "ClusterIP")),
        ("Cluster-IP", "string", 0, lambda s: s["spec"].get("clusterIP", "<pending>")),
        ("External-IP", "string", 0, lambda s: "<none>"),
        ("Port(s)", "string", 0, _ports),
        ("Age", "string", 0, _age),
    ],
}


_FILTER = re.compile(r'^(\w+)\[\?\(@\.(\w+)==["\']([^"\']*)["\']\)\]$')


def _json_path(obj: Any, path: str) -> Any:
    """``.a.b`` and ``.a[?(@.k=="v")].b``: the JSONPath subset printer columns use."""
    for part in re.split(r"\.(?![^\[]*\])", path.strip(".")):
        m = _FILTER.match(part)
        if m:
            items = obj.get(m.group(1)) if isinstance(obj, dict) else None
            obj = next((i for i in items or [] if isinstance(i, dict) and str(i.get(m.group(2))) == m.group(3)),
                       None)
        else:
            obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _path_cell(path: str) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: _json_path(obj, path)


def printer_columns(definition: dict[str, Any] | None, version: str) -> list[Column]:
    """A CRD's additionalPrinterColumns (and Age)."""
    versions: list[dict[str, Any]] = (definition or {}).get("spec", {}).get("versions", [])
    ver: dict[str, Any] = next((v for v in versions if v["name"] == version), {})
    cols: list[Column] = [(c["name"], "string" if c.get("type") == "date" else c.get("type", "string"),
                           c.get("priority", 0), _age if c.get("type") == "date" else _path_cell(c["jsonPath"]))
                          for c in ver.get("additionalPrinterColumns") or []]
    return [*cols, ("Age", "string", 0, _age)] if not any(c[0] == "Age" for c in cols) else cols


def table(kind: str, items: list[dict[str, Any]], resource_version: str,
          columns: list[Column] | None = None) -> dict[str, Any]:
    cols = columns if columns is not None else COLUMNS.get(kind, [("Age", "string", 0, _age)])
    defs = [{"name": "Name", "type": "string", "format": "name", "priority": 0, "description": "Name"},
            *({"name": n, "type": t, "format": "", "priority": p, "description": n} for n, t, p, _ in cols)]
    rows = [{"cells": [o["metadata"]["name"], *(("" if (v := cell(o)) is None else v) for *_, cell in cols)],
             "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}}
            for o in items]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": defs, "rows": rows}
