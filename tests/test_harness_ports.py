"""The harness's free ports stay out of the kernel's ephemeral range, from which outgoing connections take theirs."""

from __future__ import annotations

import socket

import pytest

import harness.process
from harness.process import ephemeral_range, free_port


def test_a_free_port_is_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40  # spread, not one port handed out again and again
    for port in ports:
        assert not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_narrow_range_below_leaves_the_ports_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness.process, "ephemeral_range", lambda: (1024, 60000))
    assert all(free_port() > 60000 for _ in range(20))


def test_no_room_outside_the_range_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness.process, "ephemeral_range", lambda: (1024, 65535))
    with pytest.raises(RuntimeError, match="no free loopback port"):
        free_port()
