"""More than one serving process on one port: a listening socket per process with SO_REUSEPORT, so the
kernel spreads new connections over the processes, and each process forked from a plain supervisor.

Every process builds its own app after the fork (its own fleet view, KV-event subscriptions, prompt
cache, load accounting and ``/metrics``): nothing is shared but the port. The supervisor serves
nothing; it forwards SIGTERM/SIGINT, and when one process ends it stops the others (a frontend that
lost a process is not whole), returning the first non-zero exit code. Linux only (SO_REUSEPORT's
balancing, ``PR_SET_PDEATHSIG`` so a process never outlives a killed supervisor).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
from collections.abc import Callable
from types import FrameType

BACKLOG = 2048
_PR_SET_PDEATHSIG = 1


def listen(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on one address; port 0 is resolved by the first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(BACKLOG)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def supervise(socks: list[socket.socket], serve: Callable[[socket.socket], int]) -> int:
    """Fork one process per socket running ``serve(sock)`` (its exit code); wait for them all."""
    pids: list[int] = []
    for sock in socks:
        pid = os.fork()
        if pid == 0:  # the serving process: it never returns from here
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                _die_with_parent()
                for other in socks:
                    if other is not sock:
                        other.close()
                code = serve(sock)
            finally:
                os._exit(code)
        pids.append(pid)
    for sock in socks:
        sock.close()
    alive = set(pids)
    stopping: list[bool] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if stopping:
            return  # once: a second SIGTERM would make uvicorn skip its graceful shutdown
        stopping.append(True)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = 0
    while alive:
        pid, status = os.wait()
        if pid not in alive:
            continue
        alive.discard(pid)
        code = code or os.waitstatus_to_exitcode(status)
        forward(signal.SIGTERM, None)  # one ended: stop the rest (a no-op once all are stopping)
    return code if code >= 0 else 128 - code
