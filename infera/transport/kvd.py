"""A kvd client: send prewarm hints (:mod:`infera.protocols.kvd`) to a daemon's Unix socket.

Fire and forget: each call connects, writes one line and closes, all within ``timeout``
seconds; the daemon never answers. Nothing on a request path awaits it. A daemon that is
missing, refuses or is too slow raises :class:`KvdUnavailable` so that the admin endpoint
can answer 503; it never raises anything else.
"""

from __future__ import annotations

import asyncio
import contextlib

from infera.protocols.kvd import PrewarmHint, encode_hint

DEFAULT_TIMEOUT = 0.5  # seconds for connect + write: a local socket answers in microseconds


class KvdUnavailable(Exception):
    """The kvd socket is not configured, not there, or did not take the hint in time."""


class KvdClient:
    def __init__(self, socket_path: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    async def send(self, hint: PrewarmHint) -> int:
        """Hand ``hint`` to the daemon; returns the bytes written. Raises :class:`KvdUnavailable`."""
        line = encode_hint(hint)
        try:
            await asyncio.wait_for(self._write(line), self.timeout)
        except TimeoutError as exc:
            raise KvdUnavailable(f"kvd socket {self.socket_path} did not take the hint within "
                                 f"{self.timeout:g}s") from exc
        except OSError as exc:
            raise KvdUnavailable(f"kvd socket {self.socket_path} unreachable: {exc.strerror or exc}") from exc
        return len(line)

    async def _write(self, line: bytes) -> None:
        _, writer = await asyncio.open_unix_connection(self.socket_path)
        try:
            writer.write(line)
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
