"""HTTP request transport: forward to the engine's own HTTP API over pooled keep-alive connections.

The request path's client is :mod:`infera.transport.http_wire` (HTTP/1.1 over asyncio, parsed by
httptools): measured against aiohttp, which was measured against httpx (bench/README.md, "HTTP
client choice"), it costs the least CPU per proxied request, which is what the router's added
latency is made of. Discovery and health GETs use it too (a third of aiohttp's CPU per GET, which
an idle frontend pays at every poll: bench/idle_cpu.py); aiohttp still takes the few GETs the pool
does not do as aiohttp would (a redirect, credentials in the URL, a URL that is not ASCII).

``first_byte_timeout`` seconds (0 = none) bound the wait from the send to the response's
first body chunk (a streamed answer's headers come before its first token); expiry is a 504
before the first byte, so the router may retry elsewhere. ``idle_timeout`` seconds (0 = none)
bound every wait for the body's next chunk, the first included: a worker that stops answering
with its socket open fails like an unreachable one before the first byte (504, retried), and
after it ends the response with a 504 :class:`UpstreamError` instead of holding the client's
stream forever.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp

from infera.protocols.worker import WorkerRecord
from infera.transport.base import UpstreamError, UpstreamResponse
from infera.transport.http_wire import BodyReader, Connection, Pool, Target, WireError, WireTimeout

KEEPALIVE_S = 60.0  # an idle pooled connection is closed after this (the engines' servers may close it first)


class IdleExpired(Exception):
    """A response's reader waited longer than the idle timeout for the next chunk."""


class IdleWatch:
    """The idle timeout of one response with one timer, re-armed lazily (a timer per chunk would
    cost more CPU than the relay itself): when it fires while a read has waited ``seconds``, the
    reader fails with :class:`IdleExpired`; time the consumer spends elsewhere never counts."""

    __slots__ = ("_handle", "_loop", "_reader", "_seconds", "waiting_since")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, reader: BodyReader) -> None:
        self._loop = loop
        self._seconds = seconds
        self._reader = reader
        self.waiting_since: float | None = None
        self._handle: asyncio.TimerHandle | None = loop.call_at(loop.time() + seconds, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        since = self.waiting_since
        if since is not None and now - since >= self._seconds:
            self._handle = None
            self._reader.set_exception(IdleExpired())
            return
        self._handle = self._loop.call_at((now if since is None else since) + self._seconds, self._check)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class HttpTransport:
    """Requests and ``get_json`` (discovery, health) go over :mod:`infera.transport.http_wire`'s pool;
    aiohttp takes the GETs the pool does not do as aiohttp would (see the module's docstring)."""

    def __init__(self, connect_timeout: float, first_byte_timeout: float, idle_timeout: float = 0.0) -> None:
        self._connect_timeout = connect_timeout
        self._first_byte_timeout = first_byte_timeout
        self._idle_timeout = idle_timeout
        self._session: aiohttp.ClientSession | None = None
        self._pool: Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # start()'s: get_running_loop() is a getpid() on 3.11
        self._targets: dict[str, Target] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        self._pool = Pool(self._connect_timeout, keepalive=KEEPALIVE_S)
        self._pool.start()
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_json(self, url: str, timeout: float) -> object:  # noqa: ASYNC109 (a per-call timeout)
        """GET a JSON document (discovery and health checks) within ``timeout`` seconds: the body as aiohttp's
        ``json()`` reads it (an empty one is None; decoded by the Content-Type's charset, else UTF-8); an
        answer of 400 or more raises, as does every failure."""
        pool = self._pool
        assert pool is not None, "transport not started"
        parts = urlsplit(url)
        if not url.isascii() or parts.username is not None or parts.password is not None:
            return await self._get_json_aiohttp(url, timeout)
        target = self._target(f"{parts.scheme}://{parts.netloc}")
        head = b"".join((b"GET ", (parts.path or "/").encode(), b"?" + parts.query.encode() if parts.query else b"",
                         b" HTTP/1.1\r\n", target.host_line, b"\r\n"))
        conn: Connection | None = None
        reader: BodyReader | None = None
        try:
            async with asyncio.timeout(timeout):
                conn = pool.take(target.key) or await pool.connect(target.key)
                reader = await conn.request(head, b"")
                parts_read = []
                while chunk := await reader.readany():
                    parts_read.append(chunk)
        except BaseException:
            if conn is not None and (reader is None or not conn.done(reader)):
                conn.abort()
            raise
        if 300 <= reader.status < 400:  # aiohttp follows redirects
            return await self._get_json_aiohttp(url, timeout)
        if reader.status >= 400:
            raise WireError(f"GET {url} answered {reader.status}")
        body = b"".join(parts_read).strip()
        return json.loads(body.decode(_charset(reader.content_type))) if body else None

    async def _get_json_aiohttp(self, url: str, timeout: float) -> object:  # noqa: ASYNC109
        assert self._session is not None, "transport not started"
        async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    def _target(self, base_url: str) -> Target:
        target = self._targets.get(base_url)
        if target is None:
            if len(self._targets) > 4096:  # workers come and go: a bound, not an eviction policy
                self._targets.clear()
            target = self._targets[base_url] = Target(base_url)
        return target

    async def send(
        self, worker: WorkerRecord, path: str, body: bytes, headers: Mapping[str, str],
        started: float | None = None,
    ) -> UpstreamResponse:
        pool, loop = self._pool, self._loop
        assert pool is not None and loop is not None, "transport not started"
        deadline = loop.time() + self._first_byte_timeout if self._first_byte_timeout else None
        conn: Connection | None = None
        try:
            target = self._target(worker.http_url)
            head = target.head(path, len(body), headers)
            conn = pool.take(target.key)
            if conn is None:
                async with asyncio.timeout_at(deadline):  # no extra task, unlike wait_for
                    conn = await pool.connect(target.key)
            # a whole small answer comes back with its body (one wake-up); the first-byte deadline is the
            # request's one timer, the idle timeout bounds the wait for that body after the head
            reader = await conn.request(head, body, deadline, self._idle_timeout)
        except (TimeoutError, WireTimeout) as exc:  # connecting, or the answer, took the whole first-byte deadline
            # (a WireTimeout: the request closed its connection, as for every failure below)
            if isinstance(exc, WireTimeout) and exc.head_seen:  # as the first body read would have said it (_Body)
                raise _no_first_byte(worker.instance_id, self._first_byte_timeout, self._idle_timeout) from exc
            raise UpstreamError(f"worker {worker.instance_id} sent no response within "
                                f"{self._first_byte_timeout:g}s", status=504) from exc
        except WireError as exc:
            raise UpstreamError(f"worker {worker.instance_id} unreachable: {exc}") from exc
        status = reader.status  # not conn's: a whole answer's connection may be serving the next request already
        if status >= 500:
            text = (await _read_some(reader, conn))[:300].decode("utf-8", "replace")
            raise UpstreamError(f"worker {worker.instance_id} answered {status}: {text}")
        content = _Body(conn, reader, worker.instance_id, deadline, self._first_byte_timeout, self._idle_timeout, loop)
        ctype = reader.content_type.decode("latin-1") if reader.content_type else "application/json"
        return UpstreamResponse(status=status, content_type=ctype, body=content, close=content.close,
                                drain=content.drain, ended=content.ended, pipe=content.pipe)


def _charset(content_type: bytes) -> str:
    """The text encoding of a JSON answer, as aiohttp's ``get_encoding`` finds it."""
    for param in content_type.decode("latin-1").lower().split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip() == "charset" and (value := value.strip().strip("\"'")):
            with contextlib.suppress(LookupError, ValueError):
                return codecs.lookup(value).name
    return "utf-8"


async def _read_some(reader: BodyReader, conn: Connection, limit: int = 65536) -> bytes:
    """The start of an error answer (up to ``limit`` bytes; the connection is dropped if more follows)."""
    parts: list[bytes] = []
    size = 0
    try:
        while size < limit and (chunk := await reader.readany()):
            parts.append(chunk)
            size += len(chunk)
    except WireError:
        pass
    if not conn.done(reader):
        conn.abort()
    return b"".join(parts)


def _no_first_byte(worker_id: str, first_byte: float, idle: float) -> UpstreamError:
    """The 504 for an answer whose first body byte did not come in time (its head may have)."""
    return UpstreamError(f"worker {worker_id} sent no first byte in time (first-byte timeout {first_byte:g}s, "
                         f"idle timeout {idle:g}s)", status=504)


class _Body:
    """A response body as one async iterator over the connection's reader: no generator in between,
    so a relayed chunk costs one ``readany`` (which joins everything buffered).

    The first chunk must come by ``deadline`` (loop time; None = no limit) and within the idle
    timeout of the headers; each later one within the idle timeout of the read that waits for it
    (one lazily re-armed timer per response, :class:`IdleWatch`). The connection goes back to the
    pool by itself once the whole response is in; ``close`` (abandonment) or a failure closes it.
    """

    __slots__ = ("_conn", "_content", "_deadline", "_first", "_idle", "_loop", "_timeout", "_watch", "_worker_id")

    def __init__(self, conn: Connection, reader: BodyReader, worker_id: str, deadline: float | None,
                 timeout: float, idle: float, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._content = reader
        self._worker_id = worker_id
        self._loop = loop
        self._idle = idle
        if idle:
            by_idle = self._loop.time() + idle
            deadline = by_idle if deadline is None else min(deadline, by_idle)
        self._deadline = deadline
        self._timeout = timeout
        self._first = True
        self._watch: IdleWatch | None = None

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        try:
            if self._first:
                self._first = False
                # usually the body came with or right after the head and is buffered: no timer needed
                chunk = self._content.read_nowait()
                try:
                    if not chunk:
                        async with asyncio.timeout_at(self._deadline):
                            chunk = await self._content.readany()
                except TimeoutError as exc:
                    self.close()
                    raise _no_first_byte(self._worker_id, self._timeout, self._idle) from exc
                if self._idle and chunk and not self._content.at_eof():  # a whole answer needs no watch
                    self._watch = IdleWatch(self._loop, self._idle, self._content)
            elif (watch := self._watch) is not None:
                watch.waiting_since = self._loop.time()
                chunk = await self._content.readany()
                watch.waiting_since = None
            else:
                chunk = await self._content.readany()
        except (IdleExpired, WireError) as exc:
            raise self._broken(exc) from exc
        if not chunk:
            self._stop_watch()
            raise StopAsyncIteration
        return chunk

    async def pipe(self, sink: Callable[[bytes], bool]) -> bool:
        """The rest of the body handed to ``sink`` as it arrives, in the connection's callback
        (:meth:`BodyReader.pipe`; call it after the first chunk is read): True at the end, False when
        ``sink`` returned False (the socket is not read until the next call). The idle timeout bounds each
        wait for the next chunk as for a read; failures are the iterator's."""
        assert not self._first, "pipe() takes over after the first chunk"
        try:
            ended = await self._content.pipe(sink, self._watch)
        except (IdleExpired, WireError) as exc:
            raise self._broken(exc) from exc
        if ended:
            self._stop_watch()
        return ended

    def _broken(self, exc: IdleExpired | WireError) -> UpstreamError:
        """Close the body after a failure mid-response; the error that says so."""
        self.close()
        if isinstance(exc, IdleExpired):
            return UpstreamError(f"worker {self._worker_id} sent nothing for {self._idle:g}s mid-response "
                                 "(--upstream-idle-timeout)", status=504, before_first_byte=False)
        return UpstreamError(f"worker {self._worker_id} broke the stream: {exc}", before_first_byte=False)

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def close(self) -> None:
        """Abandon the body: the timer stops and, unless the whole response is in, the connection is
        closed (not reused)."""
        self._stop_watch()
        if not self._conn.done(self._content):
            self._conn.abort()

    def drain(self) -> bytes:
        """What the reader holds already (b"" when nothing, or the body failed: the next read says how)."""
        return self._content.read_nowait()

    def ended(self) -> bool:
        """The whole body is in and read (a failure after the end is not possible: the reader ignores it)."""
        return self._content.at_eof()
