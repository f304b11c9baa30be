"""A ZMTP 3.0 SUB peer over tcp:// without libzmq: one engine's KV-event PUB read on a plain socket.

libzmq's SUB socket reads the TCP stream in its own I/O thread, which wakes for every batch an engine
publishes, queues it in a pipe and signals the socket's mailbox; the loop thread then takes it from there.
This reads the stream itself, in the loop thread, when a decision catches up: the kernel's socket buffer does
the queueing and nothing wakes per batch (bench/README.md "Issue 15, fifteenth round: KV events over ZMTP").

The wire (RFC 23, ZMTP 3.0; a 3.1 peer answers a 3.0 greeting in 3.0): a 64-byte greeting each way (signature,
version, the NULL mechanism), a READY command each way (ours says Socket-Type SUB), then, once the peer's READY
is in, our subscription as a message ``\\x01 + topic`` (libzmq 4.3.5's PUB takes it so from a 3.0 peer and from a
3.1 one); after that the PUB sends messages, each frame a flags byte (MORE 1, LONG 2, COMMAND 4), a 1-byte size
(8 bytes, big-endian, when LONG) and the body. Commands come only between messages; a PING is answered with a
PONG, any other is ignored.

:class:`ZmtpLink` holds the connection and the bytes read and not yet parsed (``buffer``, always starting at a
message's first frame): its :meth:`~ZmtpLink.read` takes one message in Python, and the index's C
(``drain_stream``, csrc/zmtp_drain.c) takes every queued message off the same descriptor and buffer in one call.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from infera.transport.base import StreamSink

MORE, LONG, COMMAND = 1, 2, 4

GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
"""Ours: signature, version 3.0, mechanism NULL, as-server 0, filler (64 bytes)."""

RECONNECT = 0.1
"""Seconds between connection attempts (libzmq's default ZMQ_RECONNECT_IVL)."""

HANDSHAKE_TIMEOUT = 30.0
"""Seconds a connected peer has to complete the handshake (libzmq's default ZMQ_HANDSHAKE_IVL)."""

CHUNK = 65536


class ZmtpClosed(ConnectionError):
    """The connection ended (the peer closed or reset it, or broke the protocol): reconnect."""


def frame(body: bytes, flags: int = 0) -> bytes:
    """One frame: ``flags`` (LONG added when the body needs it), size, body."""
    if len(body) > 255:
        return struct.pack(">BQ", flags | LONG, len(body)) + body
    return bytes((flags, len(body))) + body


def command(name: bytes, body: bytes = b"") -> bytes:
    return frame(bytes((len(name),)) + name + body, COMMAND)


READY = command(b"READY", b"\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB")


def tcp_address(endpoint: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://host:port`` endpoint this reader can follow; None for any other (libzmq's)."""
    if not endpoint.startswith("tcp://"):
        return None
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return None
    if parts.hostname is None or port is None or parts.path or parts.query or ";" in endpoint:
        return None  # "tcp://src;dst" (a source address) and "tcp://*:port" are libzmq's
    if parts.hostname == "*":
        return None
    return parts.hostname, port


def split(data: bytes | bytearray, at: int) -> tuple[int, list[bytes], bool] | None:
    """The frames of the message or command starting at ``data[at]``: (its end, its frames' bodies, whether it is a
    command), or None when it is not all there yet. Raises :class:`ZmtpClosed` on a command inside a message."""
    frames: list[bytes] = []
    pos, end = at, len(data)
    while True:
        if pos + 2 > end:
            return None
        flags = data[pos]
        if flags & LONG:
            if pos + 9 > end:
                return None
            size = int.from_bytes(data[pos + 1:pos + 9], "big")
            pos += 9
        else:
            size = data[pos + 1]
            pos += 2
        if pos + size > end:
            return None
        if flags & COMMAND:
            if frames:
                raise ZmtpClosed("a ZMTP command inside a message")
            return pos + size, [bytes(data[pos:pos + size])], True
        frames.append(bytes(data[pos:pos + size]))
        pos += size
        if not flags & MORE:
            return pos, frames, False


class ZmtpLink:
    """A SUB connection to one PUB at ``(host, port)`` subscribed to ``topic``; reopened by :meth:`open`.

    The ZMQ event source's link (as its libzmq one): ``drain``, when there is a :data:`StreamSink`, takes every
    queued message it can in one call; :meth:`read` takes one; :meth:`absorb` reads while the source's task owns
    the link (the descriptor signals a level: unread bytes would wake the loop at every turn); an error in ``lost``
    (any OSError, :class:`ZmtpClosed` among them) means the connection ended: :meth:`open` again."""

    lost: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, host: str, port: int, topic: bytes, sink: StreamSink | None = None) -> None:
        self.host, self.port, self.topic = host, port, topic
        self.sock: socket.socket | None = None
        self.buffer = bytearray()
        self._sink = sink
        self.drain: Callable[[str, int | None], tuple[int, int | None, Any] | None] | None = \
            None if sink is None else self._drain

    def _drain(self, worker_id: str, expected: int | None) -> tuple[int, int | None, Any] | None:
        assert self._sink is not None
        if self.sock is None:
            raise ZmtpClosed("not connected")
        return self._sink(worker_id, self.sock.fileno(), self.buffer, expected)

    def absorb(self) -> None:
        self.fill()

    @property
    def fd(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    async def open(self) -> None:
        """Connect, handshake and subscribe, retrying every :data:`RECONNECT` seconds until it succeeds (the PUB
        may bind later, or be restarting)."""
        self.close()
        while True:
            sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                rest = await asyncio.wait_for(self._handshake(sock), HANDSHAKE_TIMEOUT)
            except (TimeoutError, OSError):
                sock.close()
                await asyncio.sleep(RECONNECT)
                continue
            except BaseException:
                sock.close()
                raise
            self.sock, self.buffer = sock, bytearray(rest)
            return

    async def _handshake(self, sock: socket.socket) -> bytes:
        """Greetings and READY commands exchanged, the subscription sent; returns what followed the peer's READY."""
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (self.host, self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_sendall(sock, GREETING + READY)
        data = b""
        while True:
            got = await loop.sock_recv(sock, CHUNK)
            if not got:
                raise ZmtpClosed("the peer closed the connection in the handshake")
            data += got
            if data[:1] != b"\xff" or (len(data) >= 10 and data[9:10] != b"\x7f"):
                raise ZmtpClosed("not a ZMTP peer")
            if len(data) < 64:
                continue
            if data[10] < 3 or data[12:32].rstrip(b"\x00") != b"NULL":
                raise ZmtpClosed("a ZMTP peer older than 3.0, or not with the NULL mechanism")
            ready = split(data, 64)
            if ready is None:
                continue
            end, (body,), is_command = ready
            if not is_command or not body.startswith(b"\x05READY"):
                raise ZmtpClosed("the peer's first command is not READY")
            # only now: libzmq takes what follows our READY in the same read as a handshake command (and drops
            # the connection) unless it has sent its own READY already
            await loop.sock_sendall(sock, frame(b"\x01" + self.topic))
            return data[end:]

    def fill(self) -> bool:
        """Read what the socket holds into the buffer; False when nothing was there. Raises :class:`ZmtpClosed`."""
        sock = self.sock
        if sock is None:
            raise ZmtpClosed("not connected")
        got = False
        while True:
            try:
                data = sock.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                return got
            except OSError as exc:
                raise ZmtpClosed(str(exc)) from exc
            if not data:
                raise ZmtpClosed("the peer closed the connection")
            self.buffer += data
            got = True

    def read(self) -> list[bytes] | None:
        """One message's frames, answering the commands before it; None when no whole message is queued."""
        while True:
            got = split(self.buffer, 0)
            if got is None:
                if not self.fill():
                    return None
                continue
            end, frames, is_command = got
            del self.buffer[:end]
            if not is_command:
                return frames
            self.answer(frames[0])

    def answer(self, body: bytes) -> None:
        """A command from the peer: PING is answered with PONG and its context; any other is ignored."""
        if body.startswith(b"\x04PING") and self.sock is not None:
            try:
                self.sock.send(command(b"PONG", body[7:]))
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise ZmtpClosed(str(exc)) from exc

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.buffer = bytearray()
