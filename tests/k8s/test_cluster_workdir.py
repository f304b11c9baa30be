"""A local cluster started again in the same work directory (scripts/local-cluster keeps one) gives its
pods kubeconfigs for this run's API server, not the last run's."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.kube.cluster import LocalCluster


def test_pod_kubeconfigs_name_this_runs_server(tmp_path: Path) -> None:
    for _ in range(2):
        with LocalCluster(tmp_path, images={}) as cluster:
            path = cluster._service_account_config("default", "demo")
            server = yaml.safe_load(path.read_text())["clusters"][0]["cluster"]["server"]
            assert server == cluster.url
