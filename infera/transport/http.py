"""HTTP request transport: forward to the engine's own HTTP API over a pooled aiohttp client.

aiohttp was chosen over httpx by measurement (bench/README.md): it costs less CPU per
proxied request, which is what the router's added latency is made of.

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
from collections.abc import AsyncIterator, Mapping

import aiohttp

from infera.protocols.worker import WorkerRecord
from infera.transport.base import UpstreamError, UpstreamResponse

_CHUNK = 64 * 1024


class IdleExpired(Exception):
    """A response's reader waited longer than the idle timeout for the next chunk."""


class IdleWatch:
    """The idle timeout of one response with one timer, re-armed lazily (a timer per chunk would
    cost more CPU than the relay itself): when it fires while a read has waited ``seconds``, the
    reader fails with :class:`IdleExpired`; time the consumer spends elsewhere never counts."""

    __slots__ = ("_handle", "_loop", "_reader", "_seconds", "waiting_since")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, reader: aiohttp.StreamReader) -> None:
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
    def __init__(self, connect_timeout: float, first_byte_timeout: float, idle_timeout: float = 0.0) -> None:
        self._connect_timeout = connect_timeout
        self._first_byte_timeout = first_byte_timeout
        self._idle_timeout = idle_timeout
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_json(self, url: str, timeout: float) -> object:  # noqa: ASYNC109 (a per-call aiohttp timeout)
        """GET a JSON document (discovery and health checks)."""
        assert self._session is not None, "transport not started"
        async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    async def send(
        self, worker: WorkerRecord, path: str, body: bytes, headers: Mapping[str, str],
        started: float | None = None,
    ) -> UpstreamResponse:
        assert self._session is not None, "transport not started"
        url = worker.http_url.rstrip("/") + path
        deadline = asyncio.get_running_loop().time() + self._first_byte_timeout if self._first_byte_timeout else None
        try:
            async with asyncio.timeout_at(deadline):  # no extra task, unlike wait_for
                resp = await self._session.post(url, data=body, headers=headers)
        except TimeoutError as exc:
            raise UpstreamError(f"worker {worker.instance_id} sent no response within "
                                f"{self._first_byte_timeout:g}s", status=504) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"worker {worker.instance_id} unreachable: {exc}") from exc
        if resp.status >= 500:
            text = (await resp.read())[:300].decode("utf-8", "replace")
            resp.release()
            raise UpstreamError(f"worker {worker.instance_id} answered {resp.status}: {text}")
        return UpstreamResponse(
            status=resp.status,
            content_type=resp.headers.get("Content-Type", "application/json"),
            body=self._iter_body(resp, worker.instance_id, deadline),
            close=resp.close,
        )

    async def _iter_body(self, resp: aiohttp.ClientResponse, worker_id: str,
                         deadline: float | None) -> AsyncIterator[bytes]:
        """The body's chunks; the first must come by ``deadline`` (loop time; None = no limit), and
        each within the idle timeout of the one before (or of the headers, for the first)."""
        chunks = resp.content.iter_any()
        idle = self._idle_timeout
        loop = asyncio.get_running_loop()
        try:
            first_by = min(deadline, loop.time() + idle) if deadline is not None and idle else (
                deadline if deadline is not None else (loop.time() + idle if idle else None))
            try:
                async with asyncio.timeout_at(first_by):
                    first = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                raise UpstreamError(f"worker {worker_id} sent no first byte in time (first-byte timeout "
                                    f"{self._first_byte_timeout:g}s, idle timeout {idle:g}s)", status=504) from exc
            yield first
            if not idle:
                async for chunk in chunks:
                    yield chunk
                return
            watch = IdleWatch(loop, idle, resp.content)
            try:
                while True:
                    watch.waiting_since = loop.time()
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        return
                    except IdleExpired as exc:
                        raise UpstreamError(f"worker {worker_id} sent nothing for {idle:g}s mid-response "
                                            "(--upstream-idle-timeout)", status=504,
                                            before_first_byte=False) from exc
                    watch.waiting_since = None
                    yield chunk
            finally:
                watch.cancel()
        except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
            raise UpstreamError(f"worker {worker_id} broke the stream: {exc}", before_first_byte=False) from exc
        finally:
            resp.release()
