"""Upstream HTTP client choice: aiohttp (what infera.transport.http uses) against httpx.

One mock engine at a huge speedup. A minimal proxy process (raw ASGI app on uvicorn with
uvloop + httptools, as the frontend runs) forwards each request to the engine with a
pooled client of one library and relays the response body chunk by chunk, the way the
router's transport does. The load generator (aiohttp, this process) sends the same
~1k-token chat requests through the aiohttp proxy, the httpx proxy, and straight to the
engine (the floor). Per cell: the proxy process's CPU µs per request (/proc/<pid>/stat)
and the latency the client saw. Proxies start fresh and alternate in every round, so both
see the same machine noise; compare the ratios, not the absolute numbers.

    .venv/bin/python bench/http_client.py            # 3 rounds
    .venv/bin/python bench/http_client.py --quick    # 1 round, fewer requests
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
    machine_info,
    make_session,
    median,
    mock_engine,
    percentile,
    run_load,
    stop_all,
    write_results,
)

CLIENTS = ("aiohttp", "httpx")
TARGETS = ("direct", *CLIENTS)
MODEL = "bench-model"
CELLS = [(False, 1), (True, 1), (False, 32), (True, 32)]  # (stream, concurrency)


# ---------------------------------------------------------------------------------------
# The proxy: one process, one client library


def _proxy_app(client: str, upstream: str) -> Any:
    state: dict[str, Any] = {}

    async def start() -> None:
        if client == "aiohttp":
            import aiohttp

            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60,
                                             enable_cleanup_closed=True)
            state["s"] = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                               timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                                               skip_auto_headers=("User-Agent",))
        else:
            import httpx

            state["s"] = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=256,
                                                               keepalive_expiry=60),
                                           timeout=httpx.Timeout(None, connect=5))

    async def stop() -> None:
        s = state.pop("s", None)
        if s is not None:
            await (s.close() if client == "aiohttp" else s.aclose())

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await start()
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        chunks: list[bytes] = []
        more = True
        while more:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        url = upstream + scope["path"]
        headers = {"content-type": "application/json"}
        s = state["s"]
        if client == "aiohttp":
            resp = await s.post(url, data=b"".join(chunks), headers=headers)
            try:
                await send({"type": "http.response.start", "status": resp.status,
                            "headers": [(b"content-type", resp.headers.get("Content-Type", "").encode())]})
                async for chunk in resp.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                resp.release()
        else:
            resp = await s.send(s.build_request("POST", url, content=b"".join(chunks), headers=headers), stream=True)
            try:
                await send({"type": "http.response.start", "status": resp.status_code,
                            "headers": [(b"content-type", resp.headers.get("content-type", "").encode())]})
                async for chunk in resp.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                await resp.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def proxy_main(client: str, port: int, upstream: str) -> None:
    import uvicorn

    uvicorn.run(_proxy_app(client, upstream), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, lifespan="on")


# ---------------------------------------------------------------------------------------
# Orchestrator


async def _measure(target: str, url: str, proxy: Proc | None, engine: Proc, args: argparse.Namespace,
                   bodies: dict[bool, list[bytes]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with make_session(64) as session:
        for stream in (False, True):
            res = await run_load(session, [url], bodies[stream], 8, args.warmup, 60)
            if res.errors:
                raise RuntimeError(f"{target}: warm-up errors ({res.errors}): {res.first_error}")
        for stream, conc in CELLS:
            n = args.n1 if conc == 1 else args.n32
            p0 = proxy.cpu() if proxy else 0.0
            e0 = engine.cpu()
            res = await run_load(session, [url], bodies[stream], conc, n, 60, offset=1000)
            ok = max(res.ok, 1)
            out.append({"target": target, "stream": stream, "concurrency": conc, "ok": res.ok, "errors": res.errors,
                        "rps": res.rps, "p50_ms": percentile(res.latencies, 50) * 1e3,
                        "p99_ms": percentile(res.latencies, 99) * 1e3,
                        "ttft_p50_ms": percentile(res.ttfts, 50) * 1e3,
                        "proxy_cpu_us_per_req": ((proxy.cpu() - p0) / ok * 1e6) if proxy else 0.0,
                        "engine_cpu_us_per_req": (engine.cpu() - e0) / ok * 1e6})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round and fewer requests (~1 minute)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--n1", type=int, default=None, help="requests per cell at concurrency 1")
    ap.add_argument("--n32", type=int, default=None, help="requests per cell at concurrency 32")
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--speedup", type=float, default=100000.0)
    ap.add_argument("--proxy", choices=CLIENTS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.proxy:
        proxy_main(args.proxy, args.port, args.upstream)
        return
    rounds = args.rounds or (1 if args.quick else 3)
    args.n1 = args.n1 or (300 if args.quick else 600)
    args.n32 = args.n32 or (1000 if args.quick else 3000)
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-http-"))
    engine = mock_engine("engine-0", tok, MODEL, log_dir, args.speedup)
    bodies = {s: [chat_body(i, MODEL, s, args.max_tokens) for i in range(1024)] for s in (False, True)}
    runs: list[dict[str, Any]] = []
    info = machine_info()
    try:
        engine.start().wait_ready("/infera/worker", 60)
        for r in range(rounds):
            order = TARGETS[r % 3:] + TARGETS[: r % 3]
            for target in order:
                proxy: Proc | None = None
                try:
                    if target == "direct":
                        url = engine.url + "/v1/chat/completions"
                    else:
                        port = free_port()
                        proxy = Proc(f"proxy-{target}", [PYTHON, __file__, "--proxy", target, "--port", str(port),
                                                          "--upstream", engine.url], port,
                                     log_dir / f"proxy-{target}-r{r}.log").start()
                        _wait_port(proxy)
                        url = proxy.url + "/v1/chat/completions"
                    for row in asyncio.run(_measure(target, url, proxy, engine, args, bodies)):
                        runs.append({"round": r, **row})
                finally:
                    if proxy is not None:
                        proxy.stop()
                print(f"round {r + 1}/{rounds} {target}: done", file=sys.stderr)
    finally:
        stop_all([engine])
    summary = summarize(runs)
    print(f"\n{info['date']}  nproc={info['nproc']}  cpu={info['cpu']}  python={info['python']}  rounds={rounds}  "
          f"n1={args.n1} n32={args.n32}  max_tokens={args.max_tokens}")
    print_table(summary)
    path = write_results("http_client", {"machine": info, "command": " ".join(["bench/http_client.py", *sys.argv[1:]]),
                                         "runs": runs, "summary": summary})
    print(f"\nresults: {path}")


def _wait_port(proc: Proc, timeout: float = 30.0) -> None:
    import socket

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", proc.port)) == 0

    proc.wait_until(listening, timeout, "listening")


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over rounds per (target, cell); added latency vs direct; httpx/aiohttp ratios."""
    out: list[dict[str, Any]] = []
    for stream, conc in CELLS:
        row: dict[str, Any] = {"stream": stream, "concurrency": conc}
        for target in TARGETS:
            sel = [x for x in runs if x["target"] == target and x["stream"] == stream and x["concurrency"] == conc]
            for key in ("proxy_cpu_us_per_req", "p50_ms", "p99_ms", "ttft_p50_ms", "rps"):
                row[f"{target}_{key}"] = median([x[key] for x in sel])
            row[f"{target}_errors"] = sum(x["errors"] for x in sel)
        for client in CLIENTS:
            row[f"{client}_added_p50_ms"] = row[f"{client}_p50_ms"] - row["direct_p50_ms"]
        row["cpu_ratio_httpx_over_aiohttp"] = row["httpx_proxy_cpu_us_per_req"] / row["aiohttp_proxy_cpu_us_per_req"]
        row["added_p50_ratio_httpx_over_aiohttp"] = row["httpx_added_p50_ms"] / row["aiohttp_added_p50_ms"]
        out.append(row)
    return out


def print_table(summary: list[dict[str, Any]]) -> None:
    head = (f"{'cell':<16}| {'proxy CPU µs/req':^26} | {'p50 ms':^26} | {'added p50 ms':^21} | {'req/s':^20}\n"
            f"{'':<16}|{'aiohttp':>9}{'httpx':>9}{'ratio':>8} |{'direct':>8}{'aiohttp':>9}{'httpx':>9} |"
            f"{'aiohttp':>8}{'httpx':>7}{'ratio':>6} |{'aiohttp':>9}{'httpx':>8}")
    print(head)
    print("-" * 118)
    for r in summary:
        cell = f"{'stream' if r['stream'] else 'non-stream'} c={r['concurrency']}"
        errs = sum(r[f"{t}_errors"] for t in TARGETS)
        print(f"{cell:<16}|{r['aiohttp_proxy_cpu_us_per_req']:>9.0f}{r['httpx_proxy_cpu_us_per_req']:>9.0f}"
              f"{r['cpu_ratio_httpx_over_aiohttp']:>8.2f} |{r['direct_p50_ms']:>8.2f}{r['aiohttp_p50_ms']:>9.2f}"
              f"{r['httpx_p50_ms']:>9.2f} |{r['aiohttp_added_p50_ms']:>8.2f}{r['httpx_added_p50_ms']:>7.2f}"
              f"{r['added_p50_ratio_httpx_over_aiohttp']:>6.1f} |{r['aiohttp_rps']:>9.0f}{r['httpx_rps']:>8.0f}"
              + (f"  ERRORS {errs}" if errs else ""))


if __name__ == "__main__":
    main()
