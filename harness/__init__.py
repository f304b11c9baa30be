"""Processes for the tests and the benchmarks: one way to start, wait for, log and stop them.

A top-level package beside ``infera/`` (not shipped in the wheel, which packages ``infera*`` only)
so that ``tests/`` and ``bench/`` both import it and ``bench/`` never imports ``tests/``.

- :mod:`harness.wait`: ``wait_until(predicate, timeout, what)``, the one bounded wait.
- :mod:`harness.process`: a child process with its env, args and log, stopped by PID.
- :mod:`harness.http`: small HTTP probes (health, JSON, Prometheus samples).
- :mod:`harness.infera`: mock engines and frontends on free loopback ports.
- :mod:`harness.brokers`: a real etcd and a real nats-server, restartable.
"""

from harness.brokers import EtcdServer, NatsServer
from harness.http import get_json, http_get, http_ok, metric, scrape
from harness.infera import (
    ONE_BOX,
    frontend_argv,
    in_flight,
    index_caught_up,
    mock_argv,
    start_frontend,
    start_mock,
    wait_indexed,
)
from harness.process import REPO, Process, free_port, spawn
from harness.wait import Abort, await_until, wait_until

__all__ = [
    "ONE_BOX", "REPO", "Abort", "EtcdServer", "NatsServer", "Process", "await_until", "free_port", "frontend_argv",
    "get_json", "http_get", "http_ok", "in_flight", "index_caught_up", "metric", "mock_argv", "scrape", "spawn",
    "start_frontend", "start_mock", "wait_indexed", "wait_until",
]
