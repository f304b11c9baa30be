"""A ZMQ SUB socket returned once it is connected, instead of sleeping for the "slow joiner"."""

from __future__ import annotations

import zmq
from zmq.utils.monitor import recv_monitor_message


def subscribe(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, timeout: float = 10.0) -> zmq.Socket[bytes]:
    """A SUB socket subscribed to everything at ``endpoint``, returned once its connection handshake
    with the publisher succeeded: the subscription is the first message it then sends, so events
    published after that (e.g. by a request the test makes next) reach it."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sub.connect(endpoint)
        connected = bool(monitor.poll(int(timeout * 1000)))
        if connected:
            recv_monitor_message(monitor)
    finally:
        sub.disable_monitor()
        monitor.close(0)
    if not connected:
        sub.close(0)
        raise AssertionError(f"no ZMQ handshake with {endpoint} within {timeout}s")
    return sub
