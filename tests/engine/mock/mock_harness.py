"""The mock engine's tests: a harness mock process on a free 127.0.0.1 port, with its worker record."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from harness import Process, get_json, start_mock


class MockProcess:
    """``python -m infera.engine.mock`` (the harness's, one-box flags); healthy once constructed."""

    def __init__(self, args: list[str]) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="mock-")
        self.process: Process = start_mock(Path(self._tmp.name), args=args)
        self.url = self.process.url
        self.record: dict[str, Any] = get_json(self.url + "/infera/worker")

    def stop(self) -> None:
        self.process.stop()
        self._tmp.cleanup()

    @property
    def alive(self) -> bool:
        return self.process.alive()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
