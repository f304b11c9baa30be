"""The controllers a cluster runs besides the API server: Deployments -> Pods, Services -> a proxy.

**Deployment controller** (no ReplicaSets: pods are owned by their Deployment directly, named
``<deployment>-<template hash>-<5 chars>`` and labelled ``pod-template-hash``): keeps ``replicas``
pods of the current template, surging new ones before removing old ones (``maxSurge``/
``maxUnavailable`` of a RollingUpdate: old pods go once enough new ones are Ready), removes extra
pods newest first, and writes status (``observedGeneration``, ``replicas``, ``updatedReplicas``,
``readyReplicas``, ``availableReplicas``, ``Available`` and ``Progressing`` conditions).

**Service proxy** (kube-proxy's job): each Service of type ClusterIP gets a cluster IP from
127.0.1.0/24 at creation, and a TCP listener on ``clusterIP:port`` for each port forwards every
connection to a Ready pod that the selector matches (round-robin), at its ``targetPort`` (a number
or a container port's name).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class DeploymentController:
    """``sync`` is handed the store's verbs; it makes one pass over every Deployment."""

    def __init__(self, create: Callable[[dict[str, Any]], None], delete: Callable[[str, str], None],
                 set_status: Callable[[str, str, dict[str, Any]], None]) -> None:
        self._create, self._delete, self._set_status = create, delete, set_status

    def sync(self, deployments: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        for dep in deployments:
            self._one(dep, [p for p in pods if owned_by(p, dep["metadata"]["uid"])
                            and not p["metadata"].get("deletionTimestamp")])

    def _one(self, dep: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta, spec = dep["metadata"], dep["spec"]
        want = int(spec.get("replicas", 1))
        current = template_hash(spec["template"])
        new = [p for p in pods if p["metadata"].get("labels", {}).get("pod-template-hash") == current]
        old = [p for p in pods if p not in new]
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        surge = int(rolling.get("maxSurge", 1)) if old else 0
        unavailable = int(rolling.get("maxUnavailable", 0))
        if len(new) < want and len(pods) < want + surge:
            for _ in range(min(want - len(new), want + surge - len(pods))):
                self._create(self._pod(dep, current))
        ready_new = sum(pod_ready(p) for p in new)
        removable = max(0, ready_new + unavailable - (want - len(old))) if old else 0
        for pod in sorted(old, key=lambda p: p["metadata"]["creationTimestamp"], reverse=True)[:removable]:
            self._delete(meta["namespace"], pod["metadata"]["name"])
        if len(new) > want:
            extra = sorted(new, key=lambda p: (pod_ready(p), p["metadata"]["creationTimestamp"]))[:len(new) - want]
            for pod in extra:
                self._delete(meta["namespace"], pod["metadata"]["name"])
        ready = sum(pod_ready(p) for p in pods)
        available = ready >= want
        status = {"observedGeneration": meta.get("generation", 1), "replicas": len(pods),
                  "updatedReplicas": len(new), "readyReplicas": ready, "availableReplicas": ready,
                  "conditions": [{"type": "Available", "status": "True" if available else "False",
                                  "reason": "MinimumReplicas" + ("Available" if available else "Unavailable")},
                                 # as the deployment controller words a finished rollout (Helm's wait reads it)
                                 {"type": "Progressing", "status": "True",
                                  "reason": "NewReplicaSetAvailable" if available and not old else
                                  "ReplicaSetUpdated"}]}
        if {k: v for k, v in (dep.get("status") or {}).items()} != status:
            self._set_status(meta["namespace"], meta["name"], status)

    @staticmethod
    def _pod(dep: dict[str, Any], current: str) -> dict[str, Any]:
        template = json.loads(json.dumps(dep["spec"]["template"]))
        meta = template.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), "pod-template-hash": current}
        meta["name"] = f"{dep['metadata']['name']}-{current[:8]}-{uuid.uuid4().hex[:5]}"
        meta["namespace"] = dep["metadata"]["namespace"]
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": dep["metadata"]["name"],
                                    "uid": dep["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template.get("spec") or {}}


class ServiceProxy:
    """Listeners on cluster IPs, forwarding to the Ready pods a Service selects."""

    def __init__(self) -> None:
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._routes: dict[tuple[str, int], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        self._turn = 0

    async def sync(self, services: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        wanted: dict[tuple[str, int], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        for svc in services:
            ip, selector = svc["spec"].get("clusterIP"), svc["spec"].get("selector")
            if not ip or ip == "None" or not selector:
                continue
            backends = [p for p in pods if p["metadata"]["namespace"] == svc["metadata"]["namespace"]
                        and _selects(selector, p["metadata"].get("labels") or {}) and pod_ready(p)]
            for port in svc["spec"].get("ports") or []:
                wanted[(ip, int(port["port"]))] = (port, backends)
        self._routes = wanted
        for key in [k for k in self._servers if k not in wanted]:
            self._servers.pop(key).close()
        for key in wanted:
            if key not in self._servers:
                with contextlib.suppress(OSError):
                    self._servers[key] = await asyncio.start_server(self._handler(key), key[0], key[1])

    async def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()

    def _handler(self, key: tuple[str, int]) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                          Awaitable[None]]:
        return lambda reader, writer: self._forward(key, reader, writer)

    async def _forward(self, key: tuple[str, int], reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        port, backends = self._routes.get(key, ({}, []))
        if not backends:
            writer.close()
            return
        pod = backends[self._turn % len(backends)]
        self._turn += 1
        target = port.get("targetPort", port["port"])
        if not isinstance(target, int):
            target = next(int(p["containerPort"]) for c in pod["spec"].get("containers", [])
                          for p in c.get("ports") or [] if p.get("name") == target)
        try:
            up_reader, up_writer = await asyncio.open_connection(pod["status"]["podIP"], target)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
