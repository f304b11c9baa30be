"""``scripts/local-cluster``: run the local cluster in the foreground, with the operator and a mock fleet."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness.kube.cluster import REPO, LocalCluster

WORKDIR = REPO / ".cache" / "local-cluster"


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/local-cluster", description=__doc__)
    parser.add_argument("--empty", action="store_true", help="start the cluster only (no operator, no fleet)")
    args = parser.parse_args()
    WORKDIR.mkdir(parents=True, exist_ok=True)
    kubectl = str(Path(sys.executable).parent / "kubectl")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = LocalCluster(WORKDIR)
    with cluster:
        config = cluster.kubeconfig_path
        print(f"local-cluster: API server at {cluster.url}\n  export KUBECONFIG={config}\n"
              f"  (kubectl: {kubectl}; pod logs in {WORKDIR / 'logs'})", flush=True)
        if not args.empty:
            for manifest in ("deploy/install.yaml", "deploy/samples/mock-fleet.yaml"):
                subprocess.run([kubectl, "--kubeconfig", str(config), "apply", "--server-side", "--validate=false",
                                "-f", str(REPO / manifest)], check=True)
            print("local-cluster: waiting for InferaFleet demo to be Ready...", flush=True)
            while not stop.is_set():
                fleet = cluster.get("infera.ai/v1alpha1", "InferaFleet", "demo") or {}
                if any(c["type"] == "Ready" and c["status"] == "True"
                       for c in (fleet.get("status") or {}).get("conditions", [])):
                    ip = (cluster.get("v1", "Service", "demo-frontend") or {})["spec"]["clusterIP"]
                    print(f"local-cluster: fleet ready; try\n  curl http://{ip}:8000/v1/chat/completions "
                          "-H 'Content-Type: application/json' -d '{\"model\":\"Qwen/Qwen3-0.6B\",\"max_tokens\":16,"
                          "\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'", flush=True)
                    break
                time.sleep(0.5)
        print("local-cluster: serving until Ctrl-C", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
