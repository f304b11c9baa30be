from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness import NatsServer


@pytest.fixture
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A fresh nats-server per test (restarting it must not leak into other tests)."""
    server = NatsServer(tmp_path_factory.mktemp("nats") / "nats-server.log")
    server.start()
    yield server
    server.stop()
