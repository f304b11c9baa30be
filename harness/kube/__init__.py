"""A Kubernetes API server and cluster in one process, for tests and for people without Docker.

- :mod:`harness.kube.emulator`: the API server (objects, watches, patches, server-side apply, CRD
  admission, RBAC), served over HTTP to kubectl, kubernetes-asyncio and kopf.
- :mod:`harness.kube.cluster`: :class:`LocalCluster`, the emulator plus a Deployment controller, a
  kubelet that runs pods as local processes and a Service proxy (``scripts/local-cluster``).
"""
