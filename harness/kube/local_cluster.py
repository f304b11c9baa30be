"""``scripts/local-cluster``: run the local cluster in the foreground, with the operator and a mock fleet.

``--gaie`` applies deploy/samples/gaie-mock-fleet.yaml instead (a Gateway, and the fleet behind infera's
endpoint picker: requests go through a real Envoy). ``--check`` sends a conversation once the fleet is
Ready, prints where it went and whether later turns hit the prefix cache, and exits (0: routed, with hits).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness.kube.cluster import REPO, LocalCluster

WORKDIR = REPO / ".cache" / "local-cluster"
MODEL = "Qwen/Qwen3-0.6B"


def _ready(obj: dict[str, Any] | None, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in ((obj or {}).get("status") or {}).get(
        "conditions", []))


def _entry(cluster: LocalCluster, gaie: bool) -> str | None:
    """Where a user sends requests once everything is up: the Gateway's address, or the frontend's Service."""
    if not _ready(cluster.get("infera.ai/v1alpha1", "InferaFleet", "demo"), "Ready"):
        return None
    if gaie:
        gw = cluster.get("gateway.networking.k8s.io/v1", "Gateway", "inference-gateway")
        return f"http://{gw['status']['addresses'][0]['value']}:80" if gw and _ready(gw, "Programmed") else None
    svc = cluster.get("v1", "Service", "demo-frontend") or {}
    return f"http://{svc['spec']['clusterIP']}:8000"


def _check(url: str) -> bool:
    """Three turns of one conversation: one worker serves them all, and turns 2 and 3 reuse the prefix."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "You keep a lighthouse. " * 40},
                                      {"role": "user", "content": "What did you see tonight?"}]
    served, cached = [], []
    for _ in range(3):
        body = json.dumps({"model": MODEL, "max_tokens": 16, "messages": messages}).encode()
        request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            reply = json.load(resp)
            served.append(resp.headers.get("x-infera-worker", "?"))
        cached.append(((reply.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "And then?"}]
    ok = len(set(served)) == 1 and min(cached[1:]) > 0
    print(f"local-cluster: served by {served}, cached prompt tokens {cached}: {'ok' if ok else 'FAILED'}", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/local-cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--empty", action="store_true", help="start the cluster only (no operator, no fleet)")
    parser.add_argument("--gaie", action="store_true", help="the GAIE sample: a Gateway (real Envoy) and the picker")
    parser.add_argument("--check", action="store_true", help="send a conversation once Ready, then exit")
    args = parser.parse_args()
    WORKDIR.mkdir(parents=True, exist_ok=True)
    kubectl = str(Path(sys.executable).parent / "kubectl")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = LocalCluster(WORKDIR)
    sample = "deploy/samples/gaie-mock-fleet.yaml" if args.gaie else "deploy/samples/mock-fleet.yaml"
    with cluster:
        config = cluster.kubeconfig_path
        print(f"local-cluster: API server at {cluster.url}\n  export KUBECONFIG={config}\n"
              f"  (kubectl: {kubectl}; pod logs in {WORKDIR / 'logs'})", flush=True)
        if args.empty:
            stop.wait()
            return 0
        for manifest in ("deploy/install.yaml", sample):
            subprocess.run([kubectl, "--kubeconfig", str(config), "apply", "--server-side",
                            "-f", str(REPO / manifest)], check=True)
        print("local-cluster: waiting for InferaFleet demo to be Ready...", flush=True)
        deadline = time.monotonic() + 300
        url = None
        while not stop.is_set() and url is None:
            if time.monotonic() > deadline:
                print("local-cluster: not Ready after 300 s; pod logs in " + str(WORKDIR / "logs"), flush=True)
                return 1
            url = _entry(cluster, args.gaie)
            time.sleep(0.5)
        if url is None:
            return 0
        if args.check:
            return 0 if _check(url) else 1
        print(f"local-cluster: fleet ready; try\n  curl {url}/v1/chat/completions "
              "-H 'Content-Type: application/json' -d '{\"model\":\"Qwen/Qwen3-0.6B\",\"max_tokens\":16,"
              "\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'", flush=True)
        print("local-cluster: serving until Ctrl-C", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
