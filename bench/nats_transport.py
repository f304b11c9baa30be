"""NATS request transport vs HTTP: added latency and frontend CPU per request, side by side in one run.

Two fleets of two mock engines at a huge speedup (engine time is negligible): one on
``--request-transport http`` (zmq events), one on ``--request-transport nats`` (each mock runs
its NATS bridge in-process), with a real nats-server on loopback. Scenarios per cell:

  direct   the client talks to the engines itself (the floor; measured on the HTTP fleet)
  http     one frontend, --request-transport http, --router-policy round-robin
  nats     one frontend, --request-transport nats, --router-policy round-robin

round-robin keeps tokenization out, so the difference is the transport. For each cell
(stream or not, concurrency 1 and 8): p50/p99 latency to the last byte, added latency
(p50/p99 minus direct's), and CPU per request from /proc/<pid>/stat of the frontend and of
the engines (for nats the engines' figure includes the bridge).

    .venv/bin/python bench/nats_transport.py --quick    # ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    PYTHON,
    Proc,
    chat_body,
    default_tokenizer_dir,
    free_port,
    frontend_ready,
    machine_info,
    make_session,
    mock_engine,
    percentile,
    run_load,
    stop_all,
    write_results,
)
from harness import NatsServer

MODEL = "bench-model"


def front(name: str, engines: list[Proc], log_dir: Path, transport_args: list[str]) -> Proc:
    port = free_port()
    argv = [PYTHON, "-m", "infera.server", "--host", "127.0.0.1", "--port", str(port), "--router-policy",
            "round-robin", "--discovery-backend", "static", "--log-level", "warning", *transport_args]
    for e in engines:
        argv += ["--worker-url", e.url]
    return Proc(name, argv, port, log_dir / f"{name}.log")


async def cell(urls: list[str], procs: dict[str, list[Proc]], stream: bool, conc: int, n: int,
               max_tokens: int) -> dict[str, Any]:
    bodies = [chat_body(i, MODEL, stream, max_tokens) for i in range(64)]
    async with make_session(conc) as session:
        await run_load(session, urls, bodies, conc, max(20, conc * 4), 30)  # warm-up
        before = {k: sum(p.cpu() for p in ps) for k, ps in procs.items()}
        res = await run_load(session, urls, bodies, conc, n, 120)
        after = {k: sum(p.cpu() for p in ps) for k, ps in procs.items()}
    ok = max(res.ok, 1)
    return {"p50_ms": percentile(res.latencies, 50) * 1e3, "p99_ms": percentile(res.latencies, 99) * 1e3,
            "rps": res.rps, "errors": res.errors, "first_error": res.first_error,
            **{f"cpu_us_{k}": (after[k] - before[k]) / ok * 1e6 for k in procs}}


async def measure(args: argparse.Namespace, http_engines: list[Proc], nats_engines: list[Proc], http_front: Proc,
                  nats_front: Proc) -> list[dict[str, Any]]:
    rows = []
    for stream in (False, True):
        for conc in (1, 8):
            base = {"stream": stream, "conc": conc}
            scen = {
                "direct": ([e.url + "/v1/chat/completions" for e in http_engines], {"engines": http_engines}),
                "http": ([http_front.url + "/v1/chat/completions"],
                         {"frontend": [http_front], "engines": http_engines}),
                "nats": ([nats_front.url + "/v1/chat/completions"],
                         {"frontend": [nats_front], "engines": nats_engines}),
            }
            out = {name: await cell(urls, procs, stream, conc, args.requests, args.max_tokens)
                   for name, (urls, procs) in scen.items()}
            for name in ("http", "nats"):
                r = out[name]
                rows.append({**base, "transport": name, **r,
                             "added_p50_ms": r["p50_ms"] - out["direct"]["p50_ms"],
                             "added_p99_ms": r["p99_ms"] - out["direct"]["p99_ms"]})
            rows.append({**base, "transport": "direct", **out["direct"]})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| mode | conc | transport | p50 ms | p99 ms | added p50 ms | added p99 ms | frontend CPU µs/req "
          "| engines CPU µs/req | req/s | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["transport"] == "direct":
            continue
        print(f"| {'stream' if r['stream'] else 'non-stream'} | {r['conc']} | {r['transport']} | {r['p50_ms']:.2f} | "
              f"{r['p99_ms']:.2f} | {r['added_p50_ms']:.2f} | {r['added_p99_ms']:.2f} | "
              f"{r.get('cpu_us_frontend', 0):.0f} | {r.get('cpu_us_engines', 0):.0f} | {r['rps']:.0f} | "
              f"{r['errors']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--requests", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    args.requests = args.requests or (300 if args.quick else 1500)
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-nats-"))
    broker = NatsServer(log_dir / "nats-server.log")
    broker.start()
    nats_args = ["--request-transport", "nats", "--kv-event-transport", "nats", "--nats-server", broker.url]
    http_args = ["--request-transport", "http", "--kv-event-transport", "zmq"]
    http_engines = [mock_engine(f"http-{i}", tok, MODEL, log_dir, extra=http_args).start() for i in range(2)]
    nats_engines = [mock_engine(f"nats-{i}", tok, MODEL, log_dir, extra=nats_args).start() for i in range(2)]
    procs = [*http_engines, *nats_engines]
    try:
        for e in procs:
            e.wait_ready("/health", 60)
        http_front = front("front-http", http_engines, log_dir, http_args).start()
        nats_front = front("front-nats", nats_engines, log_dir, nats_args).start()
        procs += [http_front, nats_front]
        for f in (http_front, nats_front):
            f.wait_ready("/health", 60, frontend_ready(2))
        rows = asyncio.run(measure(args, http_engines, nats_engines, http_front, nats_front))
    finally:
        stop_all(procs)
        broker.stop()
    info = machine_info()
    print(f"machine: {info['cpu']}, {info['nproc']} cores, load {' '.join(info['loadavg_at_start'])}; "
          f"{args.requests} requests per cell, max_tokens {args.max_tokens}")
    print_table(rows)
    path = write_results("nats_transport", {"machine": info, "args": vars(args), "rows": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
