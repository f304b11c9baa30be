from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import NatsServer, Process, start_frontend, start_mock

MODEL = "Qwen/Qwen3-0.6B"
MOCK_ARGS = ("--block-size", "16", "--num-kv-blocks", "2048", "--speedup-ratio", "50")


@dataclass
class Fleet:
    workers: list[Process]
    frontend: Process
    tokenizer: Path
    tmp: Path

    @property
    def base_url(self) -> str:
        return self.frontend.url + "/v1"

    def stop(self) -> None:
        self.frontend.stop()
        for w in self.workers:
            w.stop()


def make_fleet(tmp: Path, tokenizer: Path, n: int = 3, mock_args: tuple[str, ...] = MOCK_ARGS,
               frontend_args: tuple[str, ...] = (), policy: str = "kv-aware") -> Fleet:
    workers = [start_mock(tmp, model_path=tokenizer, model=MODEL, args=mock_args) for _ in range(n)]
    try:
        frontend = start_frontend(tmp, workers, tokenizer=tokenizer, policy=policy, args=frontend_args)
    except Exception:
        for w in workers:
            w.stop()
        raise
    return Fleet(workers, frontend, tokenizer, tmp)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path) -> Iterator[Fleet]:
    f = make_fleet(tmp_path_factory.mktemp("fleet"), qwen_tokenizer_dir)
    yield f
    f.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A real nats-server for one test module."""
    server = NatsServer(tmp_path_factory.mktemp("nats") / "nats-server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def procs() -> Iterator[list[Process]]:
    """Processes a test starts, stopped (newest first) when it ends."""
    started: list[Process] = []
    yield started
    for proc in reversed(started):
        proc.stop()
