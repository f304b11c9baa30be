"""Fixtures for the mock engine's tests: real processes on free 127.0.0.1 ports, stopped by PID."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from mock_harness import MockProcess


@pytest.fixture
def start_mock() -> Iterator[Callable[..., MockProcess]]:
    started: list[MockProcess] = []

    def start(*args: str) -> MockProcess:
        proc = MockProcess(list(args))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()

