"""A local cluster: the API emulator plus the controllers and a kubelet that runs pods as processes.

``with LocalCluster(tmp) as cluster:`` gives an API server that real kubectl and the operator talk
to (``cluster.kubeconfig``), where Deployments become Pods (:class:`DeploymentController`), Pods
become local processes with their own 127.0.0.x address and real probes (:class:`Kubelet`), and
ClusterIP Services answer on 127.0.1.x (:class:`ServiceProxy`), and each Gateway routing to an
InferencePool runs a real Envoy on 127.0.2.x (:class:`harness.kube.gateways.GatewayController`). One
tick every 0.2 s reconciles all four on the emulator's own event loop. ``images`` says what an image
would hold, found on this machine (:class:`harness.kube.kubelet.Kubelet`; the default maps infera's
image to this checkout's tokenizer). What it is not: no scheduler, nodes or ReplicaSets, no volumes, no DNS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from pathlib import Path
from typing import Any

from harness.kube import rbac
from harness.kube.controllers import DeploymentController, ServiceProxy
from harness.kube.emulator import BY_PATH, Emulator, Res
from harness.kube.gateways import GatewayController
from harness.kube.kubelet import Kubelet

REPO = Path(__file__).resolve().parents[2]
# infera's image (deploy/Dockerfile): the tokenizer it builds, and its processes bind the pod's address.
INFERA_IMAGE = {"files": {"/opt/infera/tokenizer": str(REPO / ".cache" / "qwen-tokenizer")},
                "env": {"INFERA_HOST": "$(POD_IP)"}}
PODS = BY_PATH[("", "v1", "pods")]
SERVICES = BY_PATH[("", "v1", "services")]
DEPLOYMENTS = BY_PATH[("apps", "v1", "deployments")]
GATEWAYS = BY_PATH[("gateway.networking.k8s.io", "v1", "gateways")]
ROUTES = BY_PATH[("gateway.networking.k8s.io", "v1", "httproutes")]
POOLS = BY_PATH[("inference.networking.k8s.io", "v1", "inferencepools")]
TICK = 0.2


class LocalCluster(Emulator):
    def __init__(self, workdir: Path, images: dict[str, dict[str, dict[str, str]]] | None = None,
                 env: dict[str, str] | None = None) -> None:
        super().__init__()
        self.workdir = workdir
        self.kubeconfig_path = workdir / "kubeconfig"
        self.images = images if images is not None else {"infera:dev": INFERA_IMAGE}
        self._env = env
        self.kubelet: Kubelet | None = None
        self._deployments = DeploymentController(self._create_pod, self._delete_pod, self._deployment_status)
        self._proxy = ServiceProxy()
        self.gateways = GatewayController(workdir / "logs", self._gateway_status)
        self._ticker: asyncio.Task[None] | None = None
        self._cluster_ips = (str(ip) for ip in ipaddress.ip_network("127.0.1.0/24").hosts())
        self._written: set[Path] = set()

    def start(self) -> None:
        super().start()
        self.kubeconfig(self.kubeconfig_path)
        self.kubelet = Kubelet(self._service_account_config, self.workdir / "logs", self.images, self._lookup,
                               self._pod_status, self._env)

        async def begin() -> None:
            self._ticker = asyncio.get_running_loop().create_task(self._run())
        self.call(begin())

    def stop(self) -> None:
        if self._loop is not None:
            async def end() -> None:
                if self._ticker is not None:
                    self._ticker.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._ticker
                await self._proxy.close()
                await self.gateways.close()
                if self.kubelet is not None:
                    await self.kubelet.close()
            self._loop.call_soon_threadsafe(lambda: None)
            asyncio.run_coroutine_threadsafe(end(), self._loop).result(60)
        super().stop()

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a controller bug must not stop the cluster; it shows in the test's logs
                import traceback
                traceback.print_exc()
            await asyncio.sleep(TICK)

    def _all(self, res: Res) -> list[dict[str, Any]]:
        return [o for (r, _, _), o in list(self.objects.items()) if r is res]

    async def _tick(self) -> None:
        for svc in self._all(SERVICES):
            spec = svc.setdefault("spec", {})
            if spec.get("type", "ClusterIP") in ("ClusterIP", "NodePort", "LoadBalancer") and not spec.get("clusterIP"):
                ip = next(self._cluster_ips)
                self._patch(SERVICES, svc["metadata"]["namespace"], svc["metadata"]["name"],
                            {"spec": {"clusterIP": ip, "clusterIPs": [ip]}}, "application/merge-patch+json", False,
                            "kube-apiserver")
        self._deployments.sync(self._all(DEPLOYMENTS), self._all(PODS))
        assert self.kubelet is not None
        await self.kubelet.sync(self._all(PODS))
        await self._proxy.sync(self._all(SERVICES), self._all(PODS))
        await self.gateways.sync(self._all(GATEWAYS), self._all(ROUTES), self._all(POOLS), self._all(SERVICES),
                                 self._all(PODS))

    # -- the verbs the controllers use (on the loop's thread) --------------------------------

    def _create_pod(self, pod: dict[str, Any]) -> None:
        self._create(PODS, pod["metadata"]["namespace"], pod, "deployment-controller")

    def _delete_pod(self, namespace: str, name: str) -> None:
        if (PODS, namespace, name) in self.objects:
            self._delete(PODS, namespace, name)

    def _deployment_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        if (DEPLOYMENTS, namespace, name) in self.objects:
            self._patch(DEPLOYMENTS, namespace, name, {"status": status}, "application/merge-patch+json", True,
                        "deployment-controller")

    def _pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        if (PODS, namespace, name) in self.objects:
            self._patch(PODS, namespace, name, {"status": status}, "application/merge-patch+json", True, "kubelet")

    def _gateway_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        res = {"Gateway": GATEWAYS, "HTTPRoute": ROUTES, "InferencePool": POOLS}[kind]
        if (res, namespace, name) in self.objects:
            self._patch(res, namespace, name, {"status": status}, "application/merge-patch+json", True,
                        "gateway-controller")

    def _service_account_config(self, namespace: str, account: str) -> Path:
        path = self.workdir / "kubeconfigs" / f"{namespace}_{account}.yaml"
        if path not in self._written:  # written once per run: a workdir kept from an earlier run names its port
            path.parent.mkdir(parents=True, exist_ok=True)
            self.kubeconfig(path, namespace, rbac.sa_token(namespace, account))
            self._written.add(path)
        return path

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        res = next(r for r in BY_PATH.values() if r.kind == kind and r.group == "")
        return self.objects.get((res, namespace, name))

    def pod_log(self, namespace: str, pod: str, container: str | None) -> str:
        """What ``kubectl logs`` shows: the container's output (the first container by default)."""
        obj = self.objects.get((PODS, namespace, pod))
        if obj is None or self.kubelet is None:
            return ""
        name = container or obj["spec"]["containers"][0]["name"]
        path = self.kubelet.log_path(namespace, pod, name)
        return path.read_text(errors="replace") if path.exists() else ""
