"""A fleet of mock engines behind one ``infera.server`` on one plane, with the faults to inject.

Planes: ``static`` (static discovery, HTTP requests, ZMQ events), ``etcd`` (etcd discovery, HTTP,
ZMQ) and ``nats`` (etcd discovery, NATS requests and events). Everything binds to 127.0.0.1 on free
ports and is stopped by PID. Timeouts are short on purpose (3 s) so a hung worker is noticed
within one scenario.
"""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import EtcdServer, NatsServer, Process, free_port, frontend_argv, get_json, in_flight, mock_argv
from harness.http import http_get

PLANES = ("static", "etcd", "nats")
PLANE_NAMES = {"static": "static/http/zmq", "etcd": "etcd/http/zmq", "nats": "etcd/nats/nats"}
MODEL = "mock-model"
TIMEOUT_S = 3.0  # first-byte, idle and NATS idle timeouts of the frontend under test
FRONTEND_ARGS = ("--upstream-first-byte-timeout", str(TIMEOUT_S), "--upstream-idle-timeout", str(TIMEOUT_S),
                 "--nats-req-idle-timeout", str(TIMEOUT_S), "--request-max-retries", "2",
                 "--worker-poll-interval", "0.5", "--log-level", "warning")


def post_json(url: str, body: dict[str, Any], timeout: float = 3.0) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


class Fleet:
    """``n`` mock engines and a frontend on ``plane``; :meth:`start` waits until all serve."""

    def __init__(self, plane: str, tmp: Path, tokenizer: Path, n: int = 3, speedup: float = 1.0,
                 python: str = "") -> None:
        assert plane in PLANES, plane
        self.plane, self.tmp, self.tokenizer, self.n = plane, tmp, tokenizer, n
        self.python = python
        self.etcd: EtcdServer | None = None
        self.nats: NatsServer | None = None
        if plane in ("etcd", "nats"):
            self.etcd = EtcdServer(tmp / "etcd-data")
        if plane == "nats":
            self.nats = NatsServer(tmp / "nats.log")
        self.speedup = speedup
        self.workers = [self._mock(i, speedup) for i in range(n)]
        self.next_id = n
        port = free_port()
        args: list[str] = [*FRONTEND_ARGS, *self._plane_args()]
        urls = [w.url for w in self.workers] if plane == "static" else []
        kw = {"python": python} if python else {}
        self.frontend = Process(frontend_argv(port, urls, tokenizer=tokenizer, args=args, **kw),
                                tmp / "frontend.log", url=f"http://127.0.0.1:{port}", name="frontend")

    def _plane_args(self) -> list[str]:
        args: list[str] = []
        if self.etcd is not None:
            args += ["--discovery-backend", "etcd", "--etcd-endpoint", self.etcd.endpoint]
        if self.nats is not None:
            args += ["--request-transport", "nats", "--kv-event-transport", "nats", "--nats-server", self.nats.url]
        return args

    def _mock(self, i: int, speedup: float) -> Process:
        port = free_port()
        args = ["--instance-id", f"w{i}", "--speedup-ratio", str(speedup), "--log-level", "warning",
                "--lease-ttl", "3", "--drain-seconds", "3", *self._plane_args()]
        kw = {"python": self.python} if self.python else {}
        return Process(mock_argv(port, model_path=self.tokenizer, model=MODEL, args=args, **kw),
                       self.tmp / f"w{i}.log", url=f"http://127.0.0.1:{port}", name=f"w{i}")

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        for broker in (self.etcd, self.nats):
            if broker is not None:
                broker.start()
        for w in self.workers:
            w.start()
        for w in self.workers:
            self.wait_worker(w)
        self.start_frontend()

    def start_frontend(self) -> None:
        self.frontend.start()
        self.frontend.wait_until(self.full, 60, f"serving all {self.n} workers")

    def wait_worker(self, w: Process, timeout: float = 60.0) -> None:
        w.wait_until(lambda: http_get(w.url + "/health", 1.0)[0] == 200, timeout, "healthy")

    def churn(self) -> tuple[str, str]:
        """Retire the oldest worker (SIGTERM: it deregisters and drains) and start a new one under a new
        id (etcd planes: the static plane's worker list is fixed). Returns ``(retired id, new id)``."""
        assert self.plane != "static", "churn needs discovery that takes new workers"
        old = self.workers.pop(0)
        new = self._mock(self.next_id, self.speedup)
        self.next_id += 1
        new.start()
        self.wait_worker(new)
        self.workers.append(new)
        old.stop(30.0)
        return old.name, new.name

    def stop(self) -> None:
        for p in [self.frontend, *self.workers, *(b for b in (self.nats, self.etcd) if b is not None)]:
            with contextlib.suppress(Exception):
                p.stop(5.0)

    # -- state -----------------------------------------------------------------------------

    def routable(self) -> int:
        """Workers the frontend would route to now (0 when it does not answer)."""
        status, body = http_get(self.frontend.url + "/health", 1.0)
        if status != 200:
            return 0
        return int(json.loads(body).get("workers", 0))

    def full(self) -> bool:
        return self.routable() == self.n

    def in_flight(self) -> float:
        return in_flight(self.frontend.url)

    def ledgers(self, workers: Sequence[Process] | None = None) -> list[dict[str, int]]:
        out = []
        for w in workers or self.workers:
            with contextlib.suppress(OSError, ValueError):
                out.append(dict(get_json(w.url + "/infera/requests", 3.0)["requests"]))
        return out

    def clear_faults(self) -> None:
        for w in self.workers:
            if w.alive():
                with contextlib.suppress(OSError):
                    post_json(w.url + "/infera/faults", {"slowdown": 1, "hang": False, "kv_events_paused": False})

    # -- faults ----------------------------------------------------------------------------

    def fault(self, w: Process, **knobs: Any) -> None:
        post_json(w.url + "/infera/faults", knobs)

    def signal(self, p: Process, sig: signal.Signals) -> None:
        assert p.popen is not None
        p.popen.send_signal(sig)

    def restart(self, p: Process, timeout: float = 30.0) -> None:
        """Start ``p`` again once it has exited (SIGKILL if it outlives ``timeout``)."""
        assert p.popen is not None
        try:
            p.popen.wait(timeout)
        except Exception:
            p.kill()
        p.start()

    def revoke_lease(self, worker_id: str) -> None:
        """Revoke the etcd lease under ``/infera/workers/<worker_id>`` (etcd's JSON gateway)."""
        assert self.etcd is not None
        key = base64.b64encode(f"/infera/workers/{worker_id}".encode()).decode()
        kvs = post_json(self.etcd.url + "/v3/kv/range", {"key": key}).get("kvs", [])
        if kvs:
            post_json(self.etcd.url + "/v3/lease/revoke", {"ID": kvs[0]["lease"]})


class HealthWatch:
    """Polls the frontend's routable worker count every 0.1 s in a thread: ``(t, workers)``."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.samples.append((time.monotonic() - self.t0, self.fleet.routable()))

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def full_again_after(self, t: float) -> float | None:
        """The first time after ``t`` from which on the fleet stayed full (None if never)."""
        full_since: float | None = None
        for ts, n in self.samples:
            if ts < t:
                continue
            full_since = (ts if full_since is None else full_since) if n == self.fleet.n else None
        return full_since
