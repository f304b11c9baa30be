from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import EtcdServer


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A real etcd on free loopback ports, data in a temp dir; stopped by PID."""
    server = EtcdServer(tmp_path / "etcd-data")
    server.start()
    yield server
    server.stop()
