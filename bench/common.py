"""Shared helpers for the benchmarks: processes (on the harness), prompts, a load generator.

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
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from harness import Process, free_port, frontend_argv, http_get, mock_argv

TraceFunction = Callable[[FrameType, str, Any], Any]  # what sys.settrace takes and a trace function returns

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
RESULTS = REPO / "bench" / "results"
PLOTS = REPO / "bench" / "plots"
TOKENIZER_CANDIDATES = (REPO / ".cache" / "qwen-tokenizer",)  # needs a chat template


# ---------------------------------------------------------------------------------------
# A git ref's tree, for A/B runs

C_EXTENSIONS = (("csrc/index.c", "infera/kv/_native"), ("csrc/otlp.c", "infera/telemetry/_otlp"),
                ("csrc/bpe.c", "infera/kv/_bpe"))  # as setup.py


# The start of a sitecustomize acting in infera frontends only (bench/live_kv_profile.py, bench/quality_cpu_split.py):
# what follows it, indented four spaces, runs in a process started as ``infera.server ... --router-policy P``.
FRONTEND_SITE_HEAD = r'''
import os
try:
    _cmd = open("/proc/self/cmdline", "rb").read().split(b"\0")
except OSError:
    _cmd = []
if b"infera.server" in _cmd and b"--router-policy" in _cmd:
'''


def opcode_tracer(key: Callable[[FrameType], str], frames: Counter[str], ops: Counter[str]) -> TraceFunction:
    """A ``sys.settrace`` function that counts each call (``frames``) and each bytecode it runs (``ops``, its opcode
    events) under ``key(frame)``: counts, not times, so a loaded box cannot blur them (bench/dispatch_frames.py,
    bench/lean_frames.py)."""

    def tracer(frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
        if event != "call":
            return None
        name = key(frame)
        frames[name] += 1
        frame.f_trace_opcodes = True

        def local(frame: FrameType, event: str, arg: Any) -> TraceFunction:
            if event == "opcode":
                ops[name] += 1
            return local
        return local
    return tracer


def export_ref(ref: str, dest: Path) -> Path:
    """Git ``ref``'s ``infera/`` under ``dest``, its C extensions built from its own ``csrc/`` the way setup.py
    builds them (gcc -O3), so an A/B runs the ref's C code as well as its Python. A ref without a ``csrc/`` or
    whose C does not build runs its pure-Python paths, as an install without a compiler does (said on stderr).
    Returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "infera", "csrc"], capture_output=True)
    if archive.returncode != 0:  # a ref older than csrc/
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "infera"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    cc = [*(sysconfig.get_config_var(v) or "" for v in ("CC", "CFLAGS", "CCSHARED"))]  # as setuptools compiles
    include, suffix = sysconfig.get_paths()["include"], sysconfig.get_config_var("EXT_SUFFIX")
    for source, module in C_EXTENSIONS:
        if not (dest / source).exists():
            continue
        built = subprocess.run([*" ".join(cc).split(), "-O3", "-shared", "-I", str(dest / "csrc"), "-I", include,
                                str(dest / source), "-o", str(dest / f"{module}{suffix}")],
                               capture_output=True, text=True)
        if built.returncode != 0:
            print(f"export_ref: {ref}'s {source} did not build; its pure-Python path runs:\n{built.stderr[-1500:]}",
                  file=sys.stderr)
    return dest


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
# Processes: the harness's (harness/, shared with the tests), named and started explicitly


class Proc(Process):
    """One server subprocess on 127.0.0.1:``port``, not started until :meth:`start`."""

    def __init__(self, name: str, argv: list[str], port: int, log_path: Path) -> None:
        super().__init__(argv, log_path, url=f"http://127.0.0.1:{port}", name=name)
        self.port = port

    def wait_ready(self, path: str, timeout: float, check: Any = None) -> None:
        """Poll ``path`` until it answers 200 (and ``check(body)`` is true), bounded by ``timeout``."""

        def ready() -> bool:
            status, body = http_get(self.url + path)
            return status == 200 and (check is None or bool(check(body)))

        self.wait_until(ready, timeout, f"ready at {path}")


def stop_all(procs: Sequence[Process]) -> None:
    for p in procs:
        with contextlib.suppress(Exception):
            p.stop(5.0)


def mock_engine(name: str, tokenizer: Path, model: str, log_dir: Path, speedup: float = 100000.0,
                extra: Sequence[str] = ()) -> Proc:
    port = free_port()
    argv = mock_argv(port, model_path=tokenizer, model=model, python=PYTHON,
                     args=("--speedup-ratio", str(speedup), "--instance-id", name, "--log-level", "warning", *extra))
    return Proc(name, argv, port, log_dir / f"{name}.log")


def frontend(name: str, tokenizer: Path, policy: str, workers: Sequence[Proc], log_dir: Path,
             root: Path | None = None, args: Sequence[str] = ()) -> Proc:
    """An infera frontend over ``workers``; ``root``: run the package exported there (:func:`export_ref`)."""
    port = free_port()
    argv = frontend_argv(port, [w.url for w in workers], tokenizer=tokenizer, policy=policy, python=PYTHON,
                         args=("--log-level", "warning", *args))
    return Proc(name, from_root(argv, root), port, log_dir / f"{name}.log")


def from_root(argv: list[str], root: Path | None) -> list[str]:
    """``argv`` (``python -m infera.server ...``) with ``root``'s infera first on sys.path. A child starts in
    this checkout (harness.process), and ``-m`` puts the working directory ahead of ``PYTHONPATH``: setting
    ``PYTHONPATH`` to an export does not reach a frontend; this does."""
    if root is None:
        return argv
    return [argv[0], "-c", f"import sys, runpy; sys.path.insert(0, {str(root)!r}); "
            "sys.argv[0] = 'infera.server'; runpy.run_module('infera.server', run_name='__main__')", *argv[3:]]


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
