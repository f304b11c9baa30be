"""Added latency at concurrency 1, interleaved: one mock engine; infera round-robin at git ``--ref``,
infera round-robin from this tree, and vllm-router and sglang-router round_robin over it (those
installed); a blocking raw-socket client (TCP_NODELAY, head and body in one ``sendall``, one kept-alive
connection per target) that sends request i to every target in turn (the order rotating with i), so all
targets see the same box.

Prints, per target, p50/p90 latency, the added p50 over the engine called directly, and the router
process's CPU µs per request (utime+stime over the measured requests). ~1k-token chat bodies,
non-streamed, ``max_tokens`` 8 (the bench's c=1 non-streamed cell).

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/lean_c1.py --ref main --n 1500     # ~2 min
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers
from bench.common import (
    PYTHON,
    Proc,
    chat_body,
    default_tokenizer_dir,
    export_ref,
    frontend_ready,
    mock_engine,
    percentile,
    stop_all,
)
from harness import free_port, frontend_argv

MODEL = "bench-model"


def _front(name: str, engine: Proc, log_dir: Path, root: Path | None) -> Proc:
    argv = frontend_argv(port := free_port(), [engine.url], policy="round-robin", python=PYTHON, tokenizer="",
                         args=("--log-level", "warning"))
    if root is not None:  # the exported package first on sys.path, ahead of the working tree
        argv = [PYTHON, "-c", f"import sys, runpy; sys.path.insert(0, {str(root)!r}); "
                "sys.argv[0] = 'infera.server'; runpy.run_module('infera.server', run_name='__main__')", *argv[3:]]
    return Proc(name, argv, port, log_dir / f"{name}.log")


class Client:
    """One kept-alive connection; :meth:`post` returns the seconds from the send to the whole answer."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, body: bytes) -> float:
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
        started = time.perf_counter()
        self.sock.sendall(head + body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head_end = self.buf.index(b"\r\n\r\n") + 4
        lines = self.buf[:head_end].lower().split(b"\r\n")
        if b" 200 " not in lines[0] + b" ":
            raise RuntimeError(f"answer: {self.buf[:300]!r}")
        length = next(int(v.split(b":")[1]) for v in lines if v.startswith(b"content-length:"))
        while len(self.buf) < head_end + length:
            self.buf += self._recv()
        elapsed = time.perf_counter() - started
        self.buf = self.buf[head_end + length:]
        return elapsed

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise RuntimeError("connection closed")
        return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="git ref of the 'before' frontend")
    ap.add_argument("--n", type=int, default=1500, help="measured requests per target")
    ap.add_argument("--warmup", type=int, default=200)
    args = ap.parse_args()
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-lean-c1-"))
    base = export_ref(args.ref, log_dir / "base")  # with its own C extensions
    engine = mock_engine("engine", tok, MODEL, log_dir)
    routers = {"main": _front("main", engine, log_dir, base), "branch": _front("branch", engine, log_dir, None)}
    for package in ("vllm-router", "sglang-router"):
        peer = peers.ensure(package, install=False)
        if peer.ok:
            routers[f"{package} rr"] = peers.router(peer, "round_robin", [engine.url], log_dir, tok)
    bodies = [chat_body(i, MODEL, False, 8) for i in range(400)]
    try:
        engine.start()
        engine.wait_ready("/infera/worker", 60)
        for proc in routers.values():
            proc.start()
        for name, proc in routers.items():
            if name.endswith("-router rr"):
                peers.wait_ready(proc, 1)
            else:
                proc.wait_ready("/health", 90, frontend_ready(1))
        ports = {"direct": engine.port, **{name: p.port for name, p in routers.items()}}
        clients = {name: Client(port) for name, port in ports.items()}
        names = list(clients)
        for i in range(args.warmup):
            for name in names:
                clients[name].post(bodies[i % len(bodies)])
        times: dict[str, list[float]] = {name: [] for name in names}
        cpu0 = {name: p.cpu() for name, p in routers.items()}
        for i in range(args.n):
            body = bodies[i % len(bodies)]
            k = i % len(names)
            for name in names[k:] + names[:k]:
                times[name].append(clients[name].post(body))
        cpu = {name: p.cpu() - cpu0[name] for name, p in routers.items()}
    finally:
        stop_all([*routers.values(), engine])
    direct = percentile(times["direct"], 50) * 1e3
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.n} requests per target, ref {args.ref}")
    print("| target | p50 ms | p90 ms | added p50 ms | CPU µs/req |")
    print("|---|--:|--:|--:|--:|")
    for name in names:
        p50, p90 = percentile(times[name], 50) * 1e3, percentile(times[name], 90) * 1e3
        added = "-" if name == "direct" else f"{p50 - direct:+.3f}"
        cpu_us = f"{cpu[name] / args.n * 1e6:.0f}" if name in cpu else "-"
        print(f"| {name} | {p50:.3f} | {p90:.3f} | {added} | {cpu_us} |")


if __name__ == "__main__":
    main()
