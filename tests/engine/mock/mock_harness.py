"""Helpers for the mock engine's tests: a real mock process on a free 127.0.0.1 port, stopped by PID."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MockProcess:
    """``python -m infera.engine.mock`` on a free port; healthy once constructed."""

    def __init__(self, args: list[str]) -> None:
        self.port = free_port()
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for key in [k for k in env if k.startswith("INFERA_")]:
            del env[key]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infera.engine.mock", "--host", "127.0.0.1", "--port", str(self.port),
             "--discovery-backend", "static", "--request-transport", "http", "--kv-event-transport", "zmq", *args],
            cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_healthy()
        self.record: dict[str, Any] = httpx.get(self.url + "/infera/worker").json()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                out = self.log.read().decode(errors="replace")
                raise RuntimeError(f"mock engine exited with {self.proc.returncode}:\n{out}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("mock engine did not become healthy")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
