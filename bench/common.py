"""Shared helpers for the benchmarks: processes, CPU accounting, prompts, a load generator.

Everything here is bounded (request counts and deadlines) and binds to 127.0.0.1 only.
Processes started here are stopped by their own PID, never by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
RESULTS = REPO / "bench" / "results"
PLOTS = REPO / "bench" / "plots"
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOKENIZER_CANDIDATES = (REPO / ".cache" / "qwen-tokenizer",)  # needs a chat template


# ---------------------------------------------------------------------------------------
# Machine and environment


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def default_tokenizer_dir() -> Path:
    for path in TOKENIZER_CANDIDATES:
        if (path / "tokenizer.json").is_file():
            return path
    raise SystemExit("no tokenizer dir found; build one with scripts/build_qwen_tokenizer.py .cache/qwen-tokenizer")


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads, live and exited), from /proc/<pid>/stat."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[0] is the state
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15 of stat)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except (OSError, ValueError):
        return 0, b""


@dataclasses.dataclass
class Proc:
    """One server subprocess, its log and its PID."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      cwd=REPO, start_new_session=True)
        log.close()
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_ready(self, path: str, timeout: float, check: Any = None) -> None:
        """Poll ``path`` until it answers 200 (and ``check(body)`` is true), bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early; log {self.log_path}:\n{self.tail()}")
            status, body = http_get(self.url + path)
            if status == 200 and (check is None or check(body)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s; log {self.log_path}:\n{self.tail()}")

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM this PID, then SIGKILL it after ``timeout``."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


def stop_all(procs: Sequence[Proc]) -> None:
    for p in procs:
        with contextlib.suppress(Exception):
            p.stop()


def mock_engine(name: str, tokenizer: Path, model: str, log_dir: Path, speedup: float = 100000.0,
                extra: Sequence[str] = ()) -> Proc:
    port = free_port()
    argv = [PYTHON, "-m", "infera.engine.mock", "--host", "127.0.0.1", "--port", str(port),
            "--model-path", str(tokenizer), "--served-model-name", model, "--speedup-ratio", str(speedup),
            "--instance-id", name, "--log-level", "warning",
            "--discovery-backend", "static", "--request-transport", "http", "--kv-event-transport", "zmq", *extra]
    return Proc(name, argv, port, log_dir / f"{name}.log")


def frontend(name: str, tokenizer: Path, policy: str, workers: Sequence[Proc], log_dir: Path) -> Proc:
    port = free_port()
    argv = [PYTHON, "-m", "infera.server", "--host", "127.0.0.1", "--port", str(port),
            "--router-policy", policy, "--router-tokenizer-path", str(tokenizer),
            "--discovery-backend", "static", "--request-transport", "http", "--kv-event-transport", "zmq",
            "--log-level", "warning"]
    for w in workers:
        argv += ["--worker-url", w.url]
    return Proc(name, argv, port, log_dir / f"{name}.log")


def frontend_ready(n_workers: int) -> Any:
    def check(body: bytes) -> bool:
        try:
            return bool(json.loads(body).get("workers") == n_workers)
        except (ValueError, AttributeError):
            return False
    return check


# ---------------------------------------------------------------------------------------
# Prompts: ~1k-token chat conversations whose prefixes partly repeat

_WORDS = (
    "the account service request customer order invoice payment refund shipping address delivery status "
    "policy support ticket agent escalate priority billing subscription plan upgrade cancel renewal warranty "
    "product return exchange damaged missing package tracking number carrier region warehouse inventory stock "
    "discount coupon code loyalty points balance statement tax receipt credit card bank transfer currency "
    "language tone polite concise accurate verify identity privacy data retention consent record note summary "
    "schedule appointment callback hours weekend holiday timezone response time resolution feedback survey "
    "rating complaint manager supervisor handoff transcript history context previous message reply draft"
).split()


def _text(rng: random.Random, n_words: int) -> str:
    out: list[str] = []
    for i in range(n_words):
        w = rng.choice(_WORDS)
        out.append(w.capitalize() if i % 14 == 0 else w)
        if i % 14 == 13:
            out[-1] += "."
    return " ".join(out) + "."


def chat_messages(i: int, n_prefixes: int = 16, seed: int = 7) -> list[dict[str, str]]:
    """Request ``i``: one of ``n_prefixes`` shared system prompts + history (~900 tokens with the
    Qwen tokenizer), then a user turn unique to ``i`` (~120 tokens); ~1k tokens in all."""
    group = i % n_prefixes
    shared = random.Random(seed * 1_000_003 + group)
    system = (f"You are the support assistant of tenant {group}. Follow these rules.\n"
              + "\n".join(f"{k + 1}. {_text(shared, 40)}" for k in range(15)))
    history = [
        {"role": "user", "content": _text(shared, 60)},
        {"role": "assistant", "content": _text(shared, 80)},
    ]
    own = random.Random(seed * 7_919 + i)
    question = f"Ticket {i}: " + _text(own, 110)
    return [{"role": "system", "content": system}, *history, {"role": "user", "content": question}]


def chat_body(i: int, model: str, stream: bool, max_tokens: int, n_prefixes: int = 16) -> bytes:
    payload: dict[str, Any] = {"model": model, "messages": chat_messages(i, n_prefixes), "max_tokens": max_tokens,
                               "temperature": 0.0, "stream": stream}
    return json.dumps(payload, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------
# Statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank-with-interpolation percentile; nan for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


# ---------------------------------------------------------------------------------------
# Load generator (aiohttp, closed loop, bounded by count and time)


@dataclasses.dataclass
class LoadResult:
    latencies: list[float]  # seconds, request start -> last byte
    ttfts: list[float]  # seconds, request start -> first body chunk
    errors: int
    elapsed: float
    first_error: str = ""

    @property
    def ok(self) -> int:
        return len(self.latencies)

    @property
    def rps(self) -> float:
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0


async def run_load(session: Any, urls: Sequence[str], bodies: Sequence[bytes], concurrency: int, n_requests: int,
                   time_limit: float, offset: int = 0) -> LoadResult:
    """Send ``n_requests`` POSTs with ``concurrency`` in flight, cycling ``urls`` and ``bodies``.

    Stops early at ``time_limit`` seconds. A response counts as ok if it is 200 and (for a
    stream) ends with ``[DONE]``.
    """
    latencies: list[float] = []
    ttfts: list[float] = []
    errors = 0
    first_error = ""
    next_i = 0
    clock = time.perf_counter
    headers = {"content-type": "application/json"}
    started = clock()
    deadline = started + time_limit

    async def worker() -> None:
        nonlocal next_i, errors, first_error
        while next_i < n_requests and clock() < deadline:
            i = next_i
            next_i += 1
            url = urls[i % len(urls)]
            body = bodies[(i + offset) % len(bodies)]
            t0 = clock()
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    first = 0.0
                    last = b""
                    async for chunk in resp.content.iter_any():
                        if not first:
                            first = clock()
                        last = chunk
                    t1 = clock()
                    stream_ok = b"[DONE]" in last[-32:] if b'"stream":true' in body else True
                    if resp.status != 200 or not stream_ok:
                        errors += 1
                        first_error = first_error or f"{resp.status} {last[:200]!r}"
                        continue
            except Exception as exc:
                errors += 1
                first_error = first_error or repr(exc)
                continue
            latencies.append(t1 - t0)
            ttfts.append((first or t1) - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoadResult(latencies, ttfts, errors, clock() - started, first_error)


def make_session(concurrency: int) -> Any:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=max(concurrency, 1) * 2, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60),
                                 auto_decompress=False, skip_auto_headers=("User-Agent",))
