"""What the Kubernetes discovery backend and registrar share: where workers publish, and how to connect.

A worker's record is the JSON of :class:`~infera.protocols.worker.WorkerRecord` in the pod annotation
:data:`WORKER_ANNOTATION`. The API server is found in-cluster (service-account token) when the process
runs in a pod, else through a kubeconfig (``--kubeconfig``/``$KUBECONFIG``/``~/.kube/config``).
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client import ApiClient, Configuration

WORKER_ANNOTATION = "infera.ai/worker"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


async def api_client(kubeconfig: str = "") -> ApiClient:
    """A client for the cluster this process runs in, or the one a kubeconfig names.

    An explicit ``kubeconfig`` wins; otherwise in-cluster config inside a pod, else ``$KUBECONFIG``
    or ``~/.kube/config``.
    """
    cfg = Configuration()
    if not kubeconfig and in_cluster():
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        await k8s_config.load_kube_config(config_file=path, client_configuration=cfg, persist_config=False)
    return ApiClient(configuration=cfg)


def own_namespace(configured: str = "") -> str:
    """``configured`` if set, else the pod's service-account namespace, else ``default``."""
    if configured:
        return configured
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"
