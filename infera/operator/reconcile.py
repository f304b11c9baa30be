"""The one idempotent ``reconcile()``: make a fleet's children match its spec, then say so in its status.

Every handler (create, update, resume, the periodic timer) calls it; running it twice in a row
changes nothing the second time. Steps:

1. read the InferaFleet (gone or terminating: nothing to do, owner references let the garbage
   collector remove the children);
2. build the desired children (pure); a spec the processes would refuse is ``Degraded/InvalidSpec``;
3. for each child: leave it and report ``Degraded/OwnedElsewhere`` if another controller owns it;
   otherwise server-side apply it whole (field manager ``infera-operator``, forced): that creates
   it, adopts an orphan (owner references merge by uid), removes fields an earlier spec set and
   this one does not, and undoes drift (a ``kubectl scale``, an edited selector); an apply that
   changes nothing writes nothing;
4. delete children labelled for this fleet, owned by it, that are no longer desired (a pool
   removed, GAIE turned off);
5. write status (observedGeneration, conditions Ready/Progressing/Degraded, ready workers per pool,
   the frontend's address) only when it changed.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from infera.config.base import ConfigError
from infera.operator.builders import (
    FLEET_LABEL,
    FRONTEND_PORT,
    Owner,
    frontend_service,
    pool_deployment,
)
from infera.operator.gaie import epp_name
from infera.operator.kube import KINDS, Kind, Kube, kind_of
from infera.operator.render import build_children
from infera.operator.spec import KIND, FleetSpec

log = logging.getLogger(__name__)

FLEET = KINDS[KIND]
MANAGED = [KINDS[k] for k in ("ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "ConfigMap",
                              "InferencePool", "HTTPRoute")]
OPTIONAL = {"InferencePool": "the GAIE CRDs (InferencePool) are not installed",
            "HTTPRoute": "the Gateway API CRDs (HTTPRoute) are not installed"}


@dataclasses.dataclass
class Outcome:
    """What one reconcile did (for logs and tests)."""

    created: list[str] = dataclasses.field(default_factory=list)
    patched: list[str] = dataclasses.field(default_factory=list)
    adopted: list[str] = dataclasses.field(default_factory=list)
    deleted: list[str] = dataclasses.field(default_factory=list)
    problems: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (reason, message)
    status: dict[str, Any] | None = None

    @property
    def changed(self) -> bool:
        return bool(self.created or self.patched or self.adopted or self.deleted)


def _ref(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


async def apply(kube: Kube, desired: dict[str, Any], owner: Owner, out: Outcome) -> dict[str, Any] | None:
    current = await kube.get(kind_of(desired), owner.namespace, desired["metadata"]["name"])
    ctrl = controller_of(current) if current is not None else None
    if ctrl is not None and ctrl.get("uid") != owner.uid:
        out.problems.append(("OwnedElsewhere", f"{_ref(desired)} is controlled by {ctrl.get('kind')}/"
                                               f"{ctrl.get('name')}; not touching it"))
        return None
    live = await kube.apply(desired)
    if current is None:
        out.created.append(_ref(desired))
    elif ctrl is None:
        out.adopted.append(_ref(desired))
    elif live["metadata"].get("resourceVersion") != current["metadata"].get("resourceVersion"):
        out.patched.append(_ref(desired))
    return live


def _condition(previous: list[dict[str, Any]], kind: str, ok: bool, reason: str, message: str,
               generation: int, now: str) -> dict[str, Any]:
    status = "True" if ok else "False"
    old = next((c for c in previous if c.get("type") == kind), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") \
        else now
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since, "observedGeneration": generation}


def _deployment_state(dep: dict[str, Any] | None) -> tuple[int, int, bool]:
    """(wanted replicas, ready replicas, rolled out) of a Deployment as its controller reports it."""
    if dep is None:
        return 0, 0, False
    wanted = int(dep.get("spec", {}).get("replicas", 1))
    st = dep.get("status") or {}
    ready = int(st.get("readyReplicas") or 0)
    rolled = (int(st.get("observedGeneration") or 0) >= int(dep["metadata"].get("generation") or 1)
              and int(st.get("updatedReplicas") or 0) >= wanted and ready >= wanted)
    return wanted, ready, rolled


def build_status(fleet: dict[str, Any], spec: FleetSpec | None, deployments: dict[str, dict[str, Any] | None],
                 problems: list[tuple[str, str]], now: str) -> dict[str, Any]:
    """Pure: the status the fleet should show, given its children's state and this pass's problems."""
    generation = int(fleet["metadata"].get("generation") or 1)
    previous = (fleet.get("status") or {}).get("conditions") or []
    name, ns = fleet["metadata"]["name"], fleet["metadata"]["namespace"]
    pools: dict[str, dict[str, int]] = {}
    waiting: list[str] = []
    ready_workers = 0
    frontend = ""
    if spec is not None:
        for role, _ in spec.pools.items():
            wanted, ready, rolled = _deployment_state(deployments.get(pool_deployment_key(name, role)))
            pools[role] = {"replicas": wanted, "readyReplicas": ready}
            ready_workers += ready
            if not rolled:
                waiting.append(f"{role} {ready}/{wanted} ready")
        if spec.gaie.enabled:
            frontend = f"InferencePool {ns}/{name}" + (f" via Gateway {spec.gaie.gateway_name}"
                                                        if spec.gaie.gateway_name else "")
            wanted, ready, rolled = _deployment_state(deployments.get(epp_name(Owner(name, ns, ""))))
            if not rolled:  # the gateway fails closed without its picker
                waiting.append(f"endpoint picker {ready}/{wanted} ready")
        else:
            frontend = f"http://{frontend_service(Owner(name, ns, ''))}.{ns}.svc:{FRONTEND_PORT}"
            if spec.router.frontend_replicas:
                wanted, ready, rolled = _deployment_state(deployments.get(frontend_service_key(name)))
                if not rolled:
                    waiting.append(f"frontend {ready}/{wanted} ready")
    degraded = bool(problems)
    conditions = [
        _condition(previous, "Ready", not degraded and not waiting,
                   "Degraded" if degraded else ("Waiting" if waiting else "AllReady"),
                   "; ".join(m for _, m in problems) if degraded else ("; ".join(waiting) or "all pools ready"),
                   generation, now),
        _condition(previous, "Progressing", bool(waiting), "RollingOut" if waiting else "Stable",
                   "; ".join(waiting) or "every Deployment is rolled out", generation, now),
        _condition(previous, "Degraded", degraded, problems[0][0] if degraded else "AsExpected",
                   "; ".join(m for _, m in problems) if degraded else "", generation, now),
    ]
    return {"observedGeneration": generation, "readyWorkers": ready_workers, "pools": pools, "frontend": frontend,
            "conditions": conditions}


def pool_deployment_key(fleet: str, role: str) -> str:
    return pool_deployment(Owner(fleet, "", ""), role)


def frontend_service_key(fleet: str) -> str:
    return frontend_service(Owner(fleet, "", ""))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a == b)


async def reconcile(kube: Kube, namespace: str, name: str) -> Outcome:
    """Make the children of InferaFleet ``namespace/name`` match its spec and write its status."""
    out = Outcome()
    fleet = await kube.get(FLEET, namespace, name)
    if fleet is None or fleet["metadata"].get("deletionTimestamp"):
        return out
    owner = Owner(name, namespace, fleet["metadata"]["uid"])
    spec: FleetSpec | None = None
    desired: list[dict[str, Any]] = []
    try:
        spec = FleetSpec.parse(fleet.get("spec") or {})
        desired = build_children(owner, spec)
    except (ValidationError, ConfigError) as exc:
        out.problems.append(("InvalidSpec", str(exc).replace("\n", " ")[:500]))
        spec = None
    deployments: dict[str, dict[str, Any] | None] = {}
    for obj in desired:
        try:
            live = await apply(kube, obj, owner, out)
        except ApiException as exc:
            reason = "CRDMissing" if exc.status == 404 and obj["kind"] in OPTIONAL else "ApplyFailed"
            message = OPTIONAL[obj["kind"]] if reason == "CRDMissing" else f"{_ref(obj)}: {exc.status} {exc.reason}"
            out.problems.append((reason, message))
            continue
        if obj["kind"] == "Deployment":
            deployments[obj["metadata"]["name"]] = live
    if spec is not None:  # with an invalid spec, keep what runs rather than tear the fleet down
        await _delete_extras(kube, owner, {(o["kind"], o["metadata"]["name"]) for o in desired}, out)
    status = build_status(fleet, spec, deployments, out.problems, _now())
    old = fleet.get("status") or {}
    if not _same(_comparable(old), _comparable(status)):
        await kube.patch(FLEET, namespace, name, {"status": status}, status=True)
    out.status = status
    if out.changed or out.problems:
        log.info("reconciled %s/%s: created %s patched %s adopted %s deleted %s problems %s", namespace, name,
                 out.created, out.patched, out.adopted, out.deleted, out.problems)
    return out


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    return {**status, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                                     for c in status.get("conditions") or []]}


async def _delete_extras(kube: Kube, owner: Owner, wanted: set[tuple[str, str]], out: Outcome) -> None:
    for kind in MANAGED:
        try:
            items = await kube.list(kind, owner.namespace, f"{FLEET_LABEL}={owner.name}")
        except ApiException as exc:
            if exc.status == 404:  # an optional API that is not installed has nothing of ours
                continue
            raise
        for item in items:
            ctrl = controller_of(item)
            key = (kind.kind, item["metadata"]["name"])
            if key in wanted or ctrl is None or ctrl.get("uid") != owner.uid:
                continue
            await kube.delete(kind, owner.namespace, item["metadata"]["name"])
            out.deleted.append(f"{kind.kind}/{item['metadata']['name']}")


__all__ = ["Kind", "Outcome", "build_status", "reconcile"]
