"""infera's own processes on free loopback ports: mock engines and frontends on the one-box plane."""

from __future__ import annotations

import sys
import urllib.error
from collections.abc import Sequence
from pathlib import Path

from harness.http import get_json, http_ok
from harness.process import Process, free_port, spawn

# The one-box plane, passed explicitly: every process defaults to kubernetes/nats/nats.
ONE_BOX = ("--request-transport", "http", "--kv-event-transport", "zmq")


def mock_argv(port: int, *, model_path: str | Path = "", model: str = "mock-model", args: Sequence[str] = (),
              python: str = sys.executable) -> list[str]:
    """``python -m infera.engine.mock`` on 127.0.0.1:``port``, static discovery; ``args`` win over these."""
    return [python, "-m", "infera.engine.mock", "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", model, "--discovery-backend", "static", *ONE_BOX,
            *(["--model-path", str(model_path)] if model_path else []), *args]


def frontend_argv(port: int, worker_urls: Sequence[str], *, tokenizer: str | Path = "", policy: str = "kv-aware",
                  args: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    """``python -m infera.server`` on 127.0.0.1:``port`` over static ``worker_urls``; ``args`` win."""
    argv = [python, "-m", "infera.server", "--host", "127.0.0.1", "--port", str(port),
            "--discovery-backend", "static", *ONE_BOX, "--router-policy", policy,
            *(["--router-tokenizer-path", str(tokenizer)] if tokenizer else []), *args]
    for url in worker_urls:
        argv += ["--worker-url", url]
    return argv


def start_mock(tmp: Path, *, model_path: str | Path = "", model: str = "mock-model", args: Sequence[str] = (),
               port: int | None = None) -> Process:
    """A mock engine, returned once its /health answers 200."""
    port = port or free_port()
    proc = spawn(mock_argv(port, model_path=model_path, model=model, args=args), f"http://127.0.0.1:{port}",
                 tmp / f"mock-{port}.log")
    proc.wait_until(lambda: http_ok(proc.url + "/health"), what="healthy")
    return proc


def start_frontend(tmp: Path, workers: Sequence[Process | str], *, tokenizer: str | Path = "",
                   policy: str = "kv-aware", args: Sequence[str] = (), port: int | None = None,
                   expect_workers: int | None = None) -> Process:
    """A frontend over ``workers``, returned once /health counts ``expect_workers`` (default: all)."""
    port = port or free_port()
    urls = [w if isinstance(w, str) else w.url for w in workers]
    argv = frontend_argv(port, urls, tokenizer=tokenizer, policy=policy,
                         args=("--worker-poll-interval", "0.5", *args))
    proc = spawn(argv, f"http://127.0.0.1:{port}", tmp / f"frontend-{port}.log")
    want = len(workers) if expect_workers is None else expect_workers

    def serving() -> bool:
        try:
            return bool(get_json(proc.url + "/health", 1.0)["workers"] == want)
        except urllib.error.HTTPError as exc:  # 503 while it has no workers
            return bool(want == 0 and exc.code == 503)

    proc.wait_until(serving, what="serving its fleet")
    return proc
