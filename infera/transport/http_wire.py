"""HTTP/1.1 to the engines, as the request path needs it and no more: pooled keep-alive connections,
one request at a time on each, the answer parsed by httptools (the parser uvicorn uses).

aiohttp's ``ClientSession.post`` spent ~10 % of a round-robin frontend's CPU per request on what
this path never uses (URL objects and multidicts for the headers, cookies, tracing hooks, a
payload object and a separate task that writes the body, per-request timer objects). Here a
request is one ``transport.write`` of the head and body, the response a ``Protocol`` callback
chain feeding a :class:`BodyReader`. A connection goes back to its pool when its response has
been received in full and neither side asked to close it; an abandoned response closes it.
Idle connections are closed after ``keepalive`` seconds (checked when a connection is taken and
by a sweep). Errors are :class:`WireError` (refused, connect timeout, disconnected, malformed);
the caller maps them to its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

PAUSE_BYTES = 4 << 20  # a reader holding more than this stops reading the socket until it is read
WHOLE_BYTES = 256 << 10  # an answer with a Content-Length up to this is handed back whole (well below PAUSE_BYTES)


class WireError(Exception):
    """The connection could not be made, broke, or carried something that is not HTTP/1.1."""


class WireTimeout(WireError):
    """The request's deadline passed before its answer was handed back; ``head_seen`` when its head had come
    (a whole answer held for its body, :meth:`Connection.request`)."""

    def __init__(self, head_seen: bool) -> None:
        super().__init__("no body in time after the head" if head_seen else "no answer in time")
        self.head_seen = head_seen


class Waiting(Protocol):
    """What times a reader's waits (the idle timeout's watch)."""

    waiting_since: float | None


class BodyReader:
    """A response body as it arrives: :meth:`readany` returns everything buffered (waiting when
    there is nothing), b"" at the end; a failure is raised by the read after the bytes before it.
    ``status`` and ``content_type`` are its answer's (set at the head: the connection may serve the
    next request by the time its reader is read).

    Or :meth:`pipe`: each socket read's body bytes go to a sink in the connection's own callback (no
    future, no task step per chunk), the reading paused while the sink asks to (back-pressure)."""

    __slots__ = ("_buf", "_conn", "_eof", "_exc", "_held", "_sink", "_sink_exc", "_size", "_waiter", "_watch",
                 "content_type", "status")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.status = 0
        self.content_type = b""
        self._buf: list[bytes] = []
        self._size = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], bool] | None = None  # while a pipe() waits
        self._sink_exc: BaseException | None = None  # what the sink raised in the connection's callback
        self._held = False  # the sink asked to pause: the socket's reading is paused until the next pipe()
        self._watch: Waiting | None = None  # while a pipe() waits: told when each wait for the next chunk starts

    def feed(self, data: bytes) -> None:
        self._buf.append(data)
        self._size += len(data)
        if self._sink is not None:
            return  # handed to the sink once the socket read is parsed (flush): one write per read
        if self._size > PAUSE_BYTES:
            self._conn.pause()
        self._wake()

    def flush(self) -> None:
        """Hand what one socket read brought to the pipe's sink (the connection calls this after the parse)."""
        sink = self._sink
        if sink is None or not self._buf:
            return
        try:
            if sink(self._take()):
                if (watch := self._watch) is not None:
                    watch.waiting_since = self._conn._loop.time()  # the wait for the next chunk starts now
                return
        except Exception as exc:  # raised by the pipe, in the consumer's task, as a failing send would be
            self._sink_exc = exc
        self._sink = None
        if not self._eof:  # a complete answer's connection may be back in the pool: never pause that one
            self._held = True
            self._conn.pause()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        if not self._eof:
            self._exc = exc
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _take(self) -> bytes:
        buf = self._buf
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        if self._size > PAUSE_BYTES:
            self._conn.resume()
        self._size = 0
        return data

    async def readany(self) -> bytes:
        while True:
            if self._buf:
                return self._take()
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    async def pipe(self, sink: Callable[[bytes], bool], watch: Waiting | None = None) -> bool:
        """Hand the body to ``sink`` as it arrives, everything one socket read brought in one call, from the
        connection's callback while this waits; True at the body's end, False when ``sink`` returned False (the
        client cannot take more now: the socket is not read until the next :meth:`pipe`). A failure is raised
        after the bytes before it, as by :meth:`readany`; so is an exception of ``sink``'s. ``watch``'s
        ``waiting_since`` is the loop time each wait for a chunk started (None while this is not waiting)."""
        if self._held:
            self._held = False
            self._conn.resume()
        while True:
            if self._sink_exc is not None:
                exc, self._sink_exc = self._sink_exc, None
                raise exc
            if self._buf:
                if not sink(self._take()):
                    if not self._eof:
                        self._held = True
                        self._conn.pause()
                    return self._eof and not self._buf
                continue
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return True
            if self._held:
                return False
            self._sink = sink
            self._watch = watch
            waiter = self._waiter = self._conn._loop.create_future()
            if watch is not None:
                watch.waiting_since = self._conn._loop.time()
            try:
                await waiter
            finally:
                self._waiter = None
                self._sink = None
                self._watch = None
                if watch is not None:
                    watch.waiting_since = None

    def read_nowait(self) -> bytes:
        """What is buffered now (b"" when nothing)."""
        return self._take() if self._buf else b""

    def at_eof(self) -> bool:
        """True when the body is complete and everything in it has been read."""
        return self._eof and not self._buf


class Connection(asyncio.Protocol):
    """One keep-alive connection to one host; :meth:`request` starts an exchange on it."""

    def __init__(self, pool: Pool, key: tuple[str, int, bool]) -> None:
        self._pool = pool
        self.key = key
        self._loop = asyncio.get_running_loop()  # once: each get_running_loop() is a getpid() syscall on 3.11
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._headers: asyncio.Future[None] | None = None
        self.body: BodyReader | None = None
        self.status = 0
        self.content_type = b""
        self._framed = False  # the response has a length or is chunked (else it ends at EOF)
        self._length = -1  # the answer's Content-Length (-1: none, or chunked)
        self._held = False  # the head is in; the answer is handed back with its whole body
        self._due: float | None = None  # the request's deadline (loop time), while its answer is awaited
        self._timer: asyncio.TimerHandle | None = None  # fires at or before _due; outlives requests (see _arm)
        self._timer_at = 0.0
        self._deadline: float | None = None
        self._idle = 0.0
        self.closed = False
        self.idle_since = 0.0

    # ---- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.body is None and self._headers is None:
            self.abort()  # nothing was asked on this connection: it cannot be trusted for the next request
            return
        body = self.body  # before the parse: a complete answer's on_message_complete lets go of it
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(WireError(f"malformed response: {exc}"))
            self.abort()
            return
        if body is not None and body._sink is not None:
            body.flush()  # a piped body: this read's bytes go on in this callback

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        self._pool.forget(self)
        body = self.body
        if body is not None and self._headers is None and not self._framed:
            body.feed_eof()  # a body without length or chunks ends with the connection
            self.body = None
            return
        self._fail(WireError("server disconnected" + (f": {exc}" if exc else "")))

    # ---- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value
        elif name == b"content-length":
            self._framed = True
            if self._length == -1 and value.isdigit():
                self._length = int(value)
        elif name == b"transfer-encoding" and value.lower().find(b"chunked") >= 0:  # not `in`: a TypeError on 3.11
            self._framed = True
            self._length = -2  # chunked wins over a length (and a later length is not read)

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self.body is not None:
            self.body.status = self.status
            self.body.content_type = self.content_type
        if 0 <= self._length <= WHOLE_BYTES and self._headers is not None:
            # A small whole answer: its body is usually the engine's next write. The request's task is woken
            # once, when the body is in (on_message_complete), not at the head and again for the body; the
            # idle timeout still bounds the wait after the head (the timer is moved to it).
            self._held = True
            if self._idle:
                by_idle = self._loop.time() + self._idle
                if self._deadline is None or by_idle < self._deadline:
                    self._arm(by_idle)
            return
        self._hand_back()

    def _hand_back(self) -> None:
        self._held = False
        self._disarm()
        headers, self._headers = self._headers, None
        if headers is not None and not headers.done():
            headers.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.body is not None:
            self.body.feed(body)

    def on_message_complete(self) -> None:
        body, self.body = self.body, None
        if body is None:
            return
        body.feed_eof()
        if self._held:
            self._hand_back()
        if self._parser.should_keep_alive() and not self.closed:
            self._pool.release(self)
        else:
            self.abort()

    # ---- use --------------------------------------------------------------------------------

    async def request(self, head: bytes, body: bytes, deadline: float | None = None, idle: float = 0.0) -> BodyReader:
        """Send a request (``head`` ends with the blank line) and wait for the answer's headers;
        the returned reader has the answer's ``status`` and ``content_type`` and gets the body.

        An answer with a Content-Length of at most :data:`WHOLE_BYTES` is returned when its body is in
        whole (one wake-up, not one for the head and one for the body): then ``idle`` seconds (0 = none)
        bound the wait for the body after the head. ``deadline`` (loop time; None = none) bounds the whole
        wait. Expiry is :class:`WireTimeout` (one timer, not an ``asyncio.timeout`` context)."""
        assert self._transport is not None and self.body is None
        self._framed = False
        self._length = -1
        self._held = False
        self.status = 0
        self.content_type = b""
        self._deadline = deadline
        self._idle = idle
        reader = self.body = BodyReader(self)
        headers = self._headers = self._loop.create_future()
        self._transport.write(head + body)
        if deadline is not None:
            self._arm(deadline)
        try:
            await headers
        except BaseException:
            # failed, timed out or cancelled: an exchange still in progress is abandoned and closes the connection
            # (its answer must not reach the next request); one already received in full is not, as its
            # connection may be serving the next request already (a whole answer is handed back after it)
            if self.body is reader:
                self._disarm()
                self.abort()
            raise
        return reader

    def _arm(self, when: float) -> None:
        """Expire the exchange at ``when``. One timer serves the connection's requests in turn: it is left
        pending when a request ends (no cancel, no new handle per request) and, firing before the current
        request's deadline, re-arms itself for it; a new one is made only for a deadline before it."""
        self._due = when
        if self._timer is None or when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = self._loop.call_at(when, self._expire)

    def _disarm(self) -> None:
        self._due = None

    def _stop_timer(self) -> None:
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        due = self._due
        if due is None:
            return  # no request waits: the next one arms it again
        if self._loop.time() < due:  # an earlier request's timer (or the loop's timer granularity): wait on
            self._timer_at = due
            self._timer = self._loop.call_at(due, self._expire)
            return
        self._due = None
        headers, self._headers = self._headers, None
        if headers is not None and not headers.done():
            headers.set_exception(WireTimeout(self._held))

    def done(self, reader: BodyReader) -> bool:
        """True when ``reader``'s response has been received in full (the connection is not its any more)."""
        return self.body is not reader

    def _fail(self, exc: WireError) -> None:
        self._disarm()
        headers, self._headers = self._headers, None
        if headers is not None and not headers.done():
            if self._held:  # the head was in: the answer is handed back and its body's read fails, as for any
                self._held = False
                headers.set_result(None)
            else:
                headers.set_exception(exc)
        body, self.body = self.body, None
        if body is not None:
            body.set_exception(exc)

    def pause(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.resume_reading()

    def abort(self) -> None:
        """Close now; what is in flight fails (an abandoned response must not be read by the next one)."""
        self.closed = True
        self._stop_timer()
        self._pool.forget(self)
        if self._transport is not None:
            self._transport.abort()


class Pool:
    """Keep-alive connections by (host, port, TLS); unlimited in number, like the aiohttp pool before."""

    def __init__(self, connect_timeout: float, keepalive: float = 60.0) -> None:
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._idle: dict[tuple[str, int, bool], list[Connection]] = {}
        self._all: set[Connection] = set()
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(self._keepalive / 4, 1.0))
            now = loop.time()
            for conns in self._idle.values():
                for conn in [c for c in conns if now - c.idle_since > self._keepalive]:
                    conn.abort()

    def take(self, key: tuple[str, int, bool]) -> Connection | None:
        """An idle connection to ``key``'s host (the most recently used), or None (no await: the usual case
        costs no coroutine)."""
        idle = self._idle.get(key)
        if idle:
            now = idle[-1]._loop.time()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since <= self._keepalive:
                    return conn
                conn.abort()
        return None

    async def connect(self, key: tuple[str, int, bool]) -> Connection:
        host, port, tls = key
        loop = asyncio.get_running_loop()
        if tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_timeout or None):
                _, conn = await loop.create_connection(lambda: Connection(self, key), host, port,
                                                       ssl=self._ssl if tls else None)
        except TimeoutError as exc:
            raise WireError(f"connection timeout to {host}:{port} ({self._connect_timeout:g}s)") from exc
        except OSError as exc:
            raise WireError(f"cannot connect to {host}:{port}: {exc}") from exc
        self._all.add(conn)
        return conn

    def release(self, conn: Connection) -> None:
        conn.idle_since = conn._loop.time()
        self._idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: Connection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)


class Target:
    """A base URL, split once: the pool key, the path prefix and the request head's fixed lines."""

    __slots__ = ("_starts", "host_line", "key", "prefix")

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise WireError(f"not an http(s) URL: {base_url!r}")
        tls = url.scheme == "https"
        self.key = (url.hostname, url.port or (443 if tls else 80), tls)
        self.prefix = url.path.encode()
        self.host_line = b"Host: " + url.netloc.rsplit("@", 1)[-1].encode("idna") + b"\r\n"
        self._starts: dict[str, bytes] = {}  # path -> the head's lines before the length's value

    def head(self, path: str, length: int, headers: Mapping[str, str]) -> bytes:
        """The head of a POST of ``length`` bytes to ``path`` with ``headers`` (CR/LF in a value is refused)."""
        start = self._starts.get(path)
        if start is None:
            if len(self._starts) >= 64:  # a handful of API paths in practice: a bound, not an eviction policy
                self._starts.clear()
            start = self._starts[path] = b"".join(
                (b"POST ", self.prefix, path.encode(), b" HTTP/1.1\r\n", self.host_line, b"Content-Length: "))
        lines = [start, str(length).encode(), b"\r\n"]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise WireError(f"header {name!r} has a line break")
            lines += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)
