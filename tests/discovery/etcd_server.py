"""A real etcd (the Debian ``etcd-server`` binary) on free loopback ports, with its data in a temp dir.

``restart()`` kills it and starts it again on the same data dir and ports, as an operator's
restart would; everything is stopped by PID.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.fleet import free_port

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class EtcdServer:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.popen: subprocess.Popen[bytes] | None = None
        self._log = data_dir.with_suffix(".log")
        self._fh = open(self._log, "ab")  # noqa: SIM115 (closed in stop)

    def start(self, timeout: float = 20.0) -> None:
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        argv = [ETCD, "--name", "infera-test", "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"infera-test={peer}", "--log-level", "warn", "--logger", "zap"]
        self.popen = subprocess.Popen(argv, stdout=self._fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"etcd exited ({self.popen.returncode}):\n{self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.2):
                    pass
                if self._healthy():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"etcd not up after {timeout}s:\n{self.output()}")

    def _healthy(self) -> bool:
        import urllib.request

        with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as resp:
            return b'"true"' in resp.read()

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._fh.close()

    def output(self) -> str:
        return self._log.read_text(errors="replace")[-4000:]
