"""The routers people use instead of infera: installed from PyPI into their own venvs, started on 127.0.0.1.

  sglang-router  (Rust, PyPI ``sglang-router``): ``python -m sglang_router.launch_router``; it registers
                 workers in the background, so readiness = its ``/workers`` lists them all healthy.
                 ``--model-path`` is the local tokenizer dir so it never reaches for a model hub.
  vllm-router    (Rust, PyPI ``vllm-router``): the ``vllm-router`` binary; it waits for healthy
                 workers before it listens, so readiness = ``/health`` answers 200.

Both run ``round_robin`` and ``cache_aware`` (an approximate radix tree of the request text per worker,
with a load-balance override). Each lives in ``.cache/peers/<package>/`` (a venv made with the system
``python3``), installed once with pip (``--quick`` runs reuse it). A peer that cannot be installed or
started is reported with the reason and left out; the rest of the benchmark runs.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench.common import REPO, Proc, free_port, http_get

PEERS_DIR = REPO / ".cache" / "peers"
PACKAGES = ("sglang-router", "vllm-router")
INSTALL_TIMEOUT = 900.0  # seconds for one pip install


@dataclasses.dataclass
class Peer:
    package: str
    version: str = ""
    error: str = ""  # why it cannot be benchmarked here; empty = usable

    @property
    def venv(self) -> Path:
        return PEERS_DIR / self.package

    @property
    def ok(self) -> bool:
        return not self.error


def _pip_version(venv: Path, package: str) -> str:
    pip = venv / "bin" / "pip"
    if not pip.exists():
        return ""
    out = subprocess.run([str(pip), "show", package], capture_output=True, text=True, timeout=120)
    for line in out.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return ""


def ensure(package: str, install: bool = True) -> Peer:
    """The peer's venv and version, installing it (pip, from PyPI) if it is missing and ``install``."""
    peer = Peer(package)
    peer.version = _pip_version(peer.venv, package)
    if peer.version or not install:
        peer.error = "" if peer.version else "not installed (run without --no-install)"
        return peer
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    log = PEERS_DIR / f"{package}-install.log"
    try:
        with log.open("w") as fh:
            subprocess.run(["python3", "-m", "venv", str(peer.venv)], check=True, stdout=fh, stderr=subprocess.STDOUT,
                           timeout=300)
            subprocess.run([str(peer.venv / "bin" / "pip"), "install", "-q", package], check=True, stdout=fh,
                           stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT)
    except (subprocess.SubprocessError, OSError) as exc:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
        peer.error = f"pip install {package} failed ({exc}): {' | '.join(tail)}"
        return peer
    peer.version = _pip_version(peer.venv, package)
    peer.error = "" if peer.version else f"pip install {package} left no package (see {log})"
    return peer


def ensure_all(install: bool = True) -> dict[str, Peer]:
    return {p: ensure(p, install) for p in PACKAGES}


def router(peer: Peer, policy: str, workers: Sequence[str], log_dir: Path, tokenizer: Path, name: str = "") -> Proc:
    """A peer router process (not started) in front of ``workers`` (engine base URLs)."""
    port, prom = free_port(), free_port()
    name = name or f"{peer.package}-{policy}"
    if peer.package == "sglang-router":
        argv = [str(peer.venv / "bin" / "python"), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--worker-urls", *workers, "--policy", policy, "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(prom), "--model-path", str(tokenizer), "--log-level", "warn"]
    elif peer.package == "vllm-router":
        argv = [str(peer.venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *workers, "--policy", policy, "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(prom), "--log-level", "warning"]
    else:
        raise ValueError(peer.package)
    return Proc(name, argv, port, log_dir / f"{name}.log")


def wait_ready(proc: Proc, n_workers: int, timeout: float = 90.0) -> None:
    """Until the router lists ``n_workers`` healthy workers at ``/workers`` (bounded by ``timeout``)."""

    def ready() -> bool:
        status, body = http_get(proc.url + "/workers")
        workers = json.loads(body).get("workers", []) if status == 200 else []
        return len(workers) == n_workers and all(w.get("is_healthy") for w in workers)

    proc.wait_until(ready, timeout, f"listing {n_workers} healthy workers")
