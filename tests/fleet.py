"""Real processes for end-to-end tests: mock engines and frontends on free loopback ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
       "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bool(resp.status == 200)


class Proc:
    def __init__(self, argv: Sequence[str], url: str, log: Path) -> None:
        self.url = url
        self.log = log
        self._fh = open(log, "wb")  # noqa: SIM115 (closed in stop)
        self.popen = subprocess.Popen(list(argv), cwd=REPO, env=ENV, stdout=self._fh, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_until(self, ready: Any, timeout: float = 60.0, what: str = "ready") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.url} exited ({self.popen.returncode}):\n{self.output()}")
            try:
                if ready():
                    return
            except Exception:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.url} not {what} after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._fh.close()


def start_mock(tmp: Path, *, model_path: str | Path = "", model: str = "mock-model", args: Sequence[str] = (),
               port: int | None = None) -> Proc:
    port = port or free_port()
    argv = [sys.executable, "-m", "infera.engine.mock", "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", model,
            "--discovery-backend", "static", "--request-transport", "http", "--kv-event-transport", "zmq",
            *(["--model-path", str(model_path)] if model_path else []), *args]
    proc = Proc(argv, f"http://127.0.0.1:{port}", tmp / f"mock-{port}.log")
    proc.wait_until(lambda: http_ok(proc.url + "/health"))
    return proc


def start_frontend(tmp: Path, workers: Sequence[Proc | str], *, tokenizer: str | Path = "",
                   policy: str = "kv-aware", args: Sequence[str] = (), port: int | None = None,
                   expect_workers: int | None = None) -> Proc:
    port = port or free_port()
    argv = [sys.executable, "-m", "infera.server", "--host", "127.0.0.1", "--port", str(port),
            "--discovery-backend", "static", "--request-transport", "http", "--kv-event-transport", "zmq",
            "--router-policy", policy, "--worker-poll-interval", "0.5",
            *(["--router-tokenizer-path", str(tokenizer)] if tokenizer else []), *args]
    for w in workers:
        argv += ["--worker-url", w if isinstance(w, str) else w.url]
    proc = Proc(argv, f"http://127.0.0.1:{port}", tmp / f"frontend-{port}.log")
    want = len(workers) if expect_workers is None else expect_workers

    def ready() -> bool:
        try:
            return bool(get_json(proc.url + "/health", 1.0)["workers"] == want)
        except urllib.error.HTTPError as exc:  # 503 while it has no workers
            return bool(want == 0 and exc.code == 503)

    proc.wait_until(ready, what="serving its fleet")
    return proc


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition (0.0 if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return str(resp.read().decode())
