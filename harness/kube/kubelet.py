"""A kubelet that runs each pod's containers as local processes, with real probes.

Every pod gets its own loopback address (127.0.0.x) as its pod IP; a container that binds
``0.0.0.0`` binds that address instead, so pods listening on the same port do not collide. The
container's ``command``/``args`` run with ``python`` meaning this interpreter; its env is built as
the kubelet builds it (``value`` with ``$(VAR)`` expansion, ``valueFrom.fieldRef`` for the downward
API fields ``metadata.name``/``metadata.namespace``/``status.podIP``/``spec.serviceAccountName``,
``secretKeyRef``/``configMapKeyRef``), plus ``KUBECONFIG`` pointing at the emulator with the token
of the pod's service account, so the pod has exactly the rights RBAC gives that account.

An image is what the image would hold: ``files``, path substitutions (e.g.
``/opt/infera/tokenizer`` -> a tokenizer on this machine), and ``env``, defaults under the
container's own env (e.g. ``INFERA_HOST=$(POD_IP)``: a process that binds all interfaces inside a
pod's network namespace binds the pod's address; here it must be told).

Startup, readiness and liveness probes (``httpGet``, ``tcpSocket``, ``grpc`` (grpc.health.v1 ``Check``
of the probe's ``service``: SERVING passes), named or numbered ports) run on
their period (readiness polls every 0.5 s until first ready); readiness sets the container's
``ready`` and the pod's ``Ready`` condition, a failed liveness (``failureThreshold`` in a row) or an
exit restarts the container (``restartCount``, with backoff). A deleted pod's processes get
SIGTERM, then SIGKILL after its grace period (at most 5 s here). Logs go to one file per container
(``kubectl logs`` reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpclib
import grpclib.client
import grpclib.exceptions

from infera.picker.health import SERVING, HealthCheckRequest, HealthCheckResponse

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
FIELDS = {"metadata.name": lambda p: p["metadata"]["name"], "metadata.namespace": lambda p: p["metadata"]["namespace"],
          "status.podIP": lambda p: (p.get("status") or {}).get("podIP", ""),
          "spec.serviceAccountName": lambda p: p["spec"].get("serviceAccountName", "default"),
          "spec.nodeName": lambda p: p["spec"].get("nodeName", "")}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class Container:
    spec: dict[str, Any]
    log: Path
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    restarts: int = 0
    live_failures: int = 0
    started: bool = False  # the startup probe passed (or there is none)
    next_probe: float = 0.0  # readiness (and startup) probe due
    next_live: float = 0.0  # liveness probe due
    next_start: float = 0.0


@dataclasses.dataclass
class PodRun:
    key: tuple[str, str]
    ip: str
    containers: list[Container]
    grace: float


class Kubelet:
    """Runs on the emulator's event loop; ``sync(pods)`` is called with the live pods on every tick."""

    def __init__(self, kubeconfig: Callable[[str, str], Path], log_dir: Path,
                 images: dict[str, dict[str, dict[str, str]]],
                 lookup: Callable[[str, str, str], dict[str, Any] | None],
                 set_status: Callable[[str, str, dict[str, Any]], None], env: dict[str, str] | None = None) -> None:
        self.kubeconfig, self.log_dir, self.images = kubeconfig, log_dir, images
        self._lookup, self._set_status = lookup, set_status
        self._base_env = dict(env if env is not None else os.environ)
        self.runs: dict[tuple[str, str], PodRun] = {}
        self._ips = [f"127.0.0.{i}" for i in range(2, 255)]
        self._session: aiohttp.ClientSession | None = None

    def log_path(self, namespace: str, pod: str, container: str) -> Path:
        return self.log_dir / f"{namespace}_{pod}_{container}.log"

    async def sync(self, pods: list[dict[str, Any]]) -> None:
        live = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods
                if not p["metadata"].get("deletionTimestamp")}
        for key in [k for k in self.runs if k not in live]:
            await self._stop(self.runs.pop(key))
        loop = asyncio.get_running_loop()
        for key, pod in live.items():
            run = self.runs.get(key)
            if run is None:
                run = self.runs[key] = self._admit(pod)
            await self._tend(pod, run, loop.time())

    async def close(self) -> None:
        for run in list(self.runs.values()):
            await self._stop(run)
        self.runs.clear()
        if self._session is not None:
            await self._session.close()

    # -- one pod ---------------------------------------------------------------------------

    def _admit(self, pod: dict[str, Any]) -> PodRun:
        used = {r.ip for r in self.runs.values()}
        ip = next(a for a in self._ips if a not in used)
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        containers = [Container(c, self.log_path(ns, name, c["name"])) for c in pod["spec"].get("containers", [])]
        for c in containers:
            c.started = "startupProbe" not in c.spec
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        run = PodRun((ns, name), ip, containers, min(grace, 5.0))
        self._set_status(ns, name, {"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
                                    "startTime": _now(), "conditions": self._conditions(False)})
        return run

    async def _tend(self, pod: dict[str, Any], run: PodRun, now: float) -> None:
        pod = {**pod, "status": {**(pod.get("status") or {}), "podIP": run.ip}}
        changed = False
        for c in run.containers:
            if c.proc is not None and c.proc.returncode is not None:  # exited: restart with backoff
                c.proc, c.ready, c.started = None, False, "startupProbe" not in c.spec
                c.restarts += 1
                c.next_start = now + min(10.0, 0.5 * 2 ** min(c.restarts, 5))
                changed = True
            if c.proc is None and now >= c.next_start:
                c.proc = await self._start(pod, run, c)
                c.next_probe = now + float((c.spec.get("readinessProbe") or {}).get("initialDelaySeconds", 0))
                live = c.spec.get("livenessProbe") or {}
                c.next_live = now + float(live.get("initialDelaySeconds", 0)) + float(live.get("periodSeconds", 10))
                changed = True
            if c.proc is not None and now >= c.next_probe:
                changed |= await self._probe(run, c, now)
            if c.proc is not None and c.started and now >= c.next_live:
                await self._liveness(run, c, now)
        if changed:
            ready = all(c.ready for c in run.containers)
            self._set_status(run.key[0], run.key[1], {
                "phase": "Running", "podIP": run.ip, "podIPs": [{"ip": run.ip}], "hostIP": "127.0.0.1",
                "conditions": self._conditions(ready),
                "containerStatuses": [{"name": c.spec["name"], "ready": c.ready, "restartCount": c.restarts,
                                       "started": c.proc is not None, "image": c.spec.get("image", ""),
                                       "imageID": "local://" + c.spec.get("image", ""),
                                       "containerID": f"process://{c.proc.pid}" if c.proc is not None else "",
                                       "state": {"running": {}} if c.proc is not None else
                                       {"waiting": {"reason": "CrashLoopBackOff"}}} for c in run.containers]})

    @staticmethod
    def _conditions(ready: bool) -> list[dict[str, Any]]:
        flag = "True" if ready else "False"
        return [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": flag}, {"type": "Ready", "status": flag}]

    # -- processes -------------------------------------------------------------------------

    def _rewrite(self, image: str, text: str, ip: str) -> str:
        for path, local in (self.images.get(image) or {}).get("files", {}).items():
            text = text.replace(path, local)
        return ip if text == "0.0.0.0" else text

    def _env(self, pod: dict[str, Any], spec: dict[str, Any], ip: str) -> dict[str, str]:
        env = dict(self._base_env)
        env["KUBECONFIG"] = str(self.kubeconfig(pod["metadata"]["namespace"],
                                                pod["spec"].get("serviceAccountName") or "default"))
        env["HOSTNAME"] = pod["metadata"]["name"]
        ns = pod["metadata"]["namespace"]
        image = spec.get("image", "")
        own = {item["name"] for item in spec.get("env") or []}
        defaults = [{"name": k, "value": v} for k, v in (self.images.get(image) or {}).get("env", {}).items()
                    if k not in own]  # the image's defaults, after the container's (they may name POD_IP)
        for item in [*(spec.get("env") or []), *defaults]:
            name, source = item["name"], item.get("valueFrom")
            if source is None:
                value = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), str(item.get("value", "")))
            elif "fieldRef" in source:
                value = str(FIELDS[source["fieldRef"]["fieldPath"]](pod))
            else:
                kind, ref = ("Secret", source["secretKeyRef"]) if "secretKeyRef" in source else \
                    ("ConfigMap", source["configMapKeyRef"])
                obj = self._lookup(kind, ns, ref["name"]) or {}
                value = str((obj.get("stringData") or obj.get("data") or {}).get(ref["key"], ""))
            env[name] = self._rewrite(image, value, ip)
        return env

    async def _start(self, pod: dict[str, Any], run: PodRun, c: Container) -> asyncio.subprocess.Process:
        env = self._env(pod, c.spec, run.ip)
        image = c.spec.get("image", "")
        argv = [_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), self._rewrite(image, a, run.ip))
                for a in [*(c.spec.get("command") or []), *(c.spec.get("args") or [])]]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        c.log.parent.mkdir(parents=True, exist_ok=True)
        with c.log.open("ab") as log:
            return await asyncio.create_subprocess_exec(*argv, env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
                                                        stdin=asyncio.subprocess.DEVNULL, start_new_session=True)

    async def _stop(self, run: PodRun) -> None:
        procs = [c.proc for c in run.containers if c.proc is not None and c.proc.returncode is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), run.grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                await p.wait()

    # -- probes ----------------------------------------------------------------------------

    def _port(self, c: Container, port: Any) -> int:
        if isinstance(port, int):
            return port
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        return int(port)

    async def _check(self, run: PodRun, c: Container, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                if self._session is None:
                    self._session = aiohttp.ClientSession()
                url = f"http://{run.ip}:{self._port(c, get['port'])}{get.get('path', '/')}"
                async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    return 200 <= resp.status < 400
            if "tcpSocket" in probe:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(run.ip, self._port(c, probe["tcpSocket"]["port"])), timeout)
                writer.close()
                return True
            if "grpc" in probe:
                return await grpc_serving(run.ip, int(probe["grpc"]["port"]), probe["grpc"].get("service", ""),
                                           timeout)
        except (OSError, TimeoutError, aiohttp.ClientError):
            return False
        return True  # exec probes and the like: not emulated, taken as passing

    async def _probe(self, run: PodRun, c: Container, now: float) -> bool:
        """Run the container's due probes; True when something a pod status shows changed."""
        before = (c.ready, c.started)
        if not c.started:
            probe = c.spec["startupProbe"]
            c.started = await self._check(run, c, probe)
            c.next_probe = now + float(probe.get("periodSeconds", 10)) / 10  # startup polls briskly here
            return (c.ready, c.started) != before
        ready_probe = c.spec.get("readinessProbe")
        c.ready = await self._check(run, c, ready_probe) if ready_probe else True
        period = float((ready_probe or {}).get("periodSeconds", 10))
        c.next_probe = now + (min(period, 0.5) if not c.ready else period)  # brisk until first ready
        return (c.ready, c.started) != before

    async def _liveness(self, run: PodRun, c: Container, now: float) -> None:
        """A liveness probe on its own period; ``failureThreshold`` failures in a row restart the container."""
        live = c.spec.get("livenessProbe")
        if live is None:
            c.next_live = float("inf")
            return
        c.next_live = now + float(live.get("periodSeconds", 10))
        if await self._check(run, c, live):
            c.live_failures = 0
            return
        c.live_failures += 1
        if c.live_failures >= int(live.get("failureThreshold", 3)) and c.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, signal.SIGKILL)  # the next tick restarts it
            c.live_failures = 0


async def grpc_serving(host: str, port: int, service: str, seconds: float) -> bool:
    """A gRPC health probe, as the kubelet's: ``grpc.health.v1.Health/Check`` answers SERVING."""
    channel = grpclib.client.Channel(host, port)
    try:
        check = grpclib.client.UnaryUnaryMethod(channel, "/grpc.health.v1.Health/Check", HealthCheckRequest,
                                                HealthCheckResponse)
        reply = await check(HealthCheckRequest(service), timeout=seconds)
        return reply.status == SERVING
    except (OSError, TimeoutError, grpclib.GRPCError, grpclib.exceptions.StreamTerminatedError,
            grpclib.exceptions.ProtocolError):
        return False
    finally:
        channel.close()
