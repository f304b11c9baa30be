"""infera's own processes on free loopback ports: mock engines and frontends on the one-box plane."""

from __future__ import annotations

import sys
import urllib.error
from collections.abc import Sequence
from pathlib import Path

from harness.http import get_json, http_ok, scrape
from harness.process import Process, free_port, spawn
from harness.wait import wait_until

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
    return proc.ready_or_stopped(lambda: http_ok(proc.url + "/health"), what="healthy")


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

    return proc.ready_or_stopped(serving, what="serving its fleet")


def in_flight(frontend_url: str) -> float:
    """Requests the frontend holds on any worker (``infera_worker_in_flight`` summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(scrape(frontend_url))
               if f.name == "infera_worker_in_flight" for s in f.samples)


def index_caught_up(frontend_url: str, worker_urls: Sequence[str] = ()) -> bool:
    """True when the router indexes as many KV blocks per worker as the engine (a mock) caches,
    i.e. every KV event the engines published so far has reached it. No ``worker_urls``: all."""
    indexed = {w["http_url"]: int(w["kv_blocks_indexed"]) for w in get_json(frontend_url + "/v1/workers")["data"]}
    return all(indexed.get(url) == len(get_json(url + "/infera/kv_cache")["cached"])
               for url in (worker_urls or indexed))


def wait_indexed(frontend: Process, workers: Sequence[Process] = (), timeout: float = 10.0) -> float:
    """Wait until the frontend's index holds what the engines cache (see :func:`index_caught_up`)."""
    urls = [w.url for w in workers]
    return wait_until(lambda: index_caught_up(frontend.url, urls), timeout,
                      "the router's KV index caught up with the engines' caches", detail=frontend.output)
