"""A libzmq SUB socket as the ZMQ event source's link (:class:`infera.transport.zmtp.ZmtpLink` is the other)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import zmq
import zmq.asyncio

from infera.transport.base import SocketSink


class LibzmqLink:
    """A libzmq SUB socket connected to ``endpoint`` (libzmq reconnects it on its own): the ZMQ event source's link
    where :class:`~infera.transport.zmtp.ZmtpLink` does not go (ipc://, inproc://, or ZMTP switched off)."""

    lost: tuple[type[BaseException], ...] = ()  # libzmq reconnects by itself: nothing for the source to reopen

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, topic: str, sink: SocketSink | None) -> None:
        # a plain socket (see ZmqEventSource._follow), on the source's context
        sub: zmq.Socket[bytes] = zmq.Context.shadow(ctx.underlying).socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        sub.connect(endpoint)
        self.sub = sub
        self.fd = cast(int, sub.getsockopt(zmq.FD))
        handle = sub.underlying
        self.drain: Callable[[str, int | None], tuple[int, int | None, Any] | None] | None = \
            None if sink is None else (lambda worker_id, expected: sink(worker_id, handle, expected))

    async def open(self) -> None:
        """Connected already."""

    def read(self) -> list[bytes] | None:
        """One message's frames; None when nothing is queued."""
        sub = self.sub
        # POLLIN as a plain int: ``int & zmq.POLLIN`` goes through enum.Flag.__rand__ and builds a PollEvent
        # (~0.6 µs per test, two or more tests a batch)
        events_opt, pollin, noblock, again, more = zmq.EVENTS, int(zmq.POLLIN), zmq.NOBLOCK, zmq.Again, zmq.RCVMORE
        recv, option = sub.recv, sub.getsockopt
        while True:
            # the descriptor signals a change of state, not a level: read until the socket itself says nothing
            # is queued (a receive may have taken the signal of a later batch). Asked before each receive, not
            # after a failed one: pyzmq's zmq.Again cost an exception per wake-up
            if not cast(int, option(events_opt)) & pollin:
                return None
            try:  # recv_multipart's loop without its wrapper (~0.4 µs a message)
                frames = [recv(noblock)]
                while option(more):
                    frames.append(recv(noblock))
            except again:
                continue
            return frames

    def absorb(self) -> None:
        """Take the descriptor's signal (the messages stay queued)."""
        self.sub.getsockopt(zmq.EVENTS)

    def close(self) -> None:
        self.sub.close(linger=0)
