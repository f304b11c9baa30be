"""The worker's side of NATS: bridge requests to the engine's HTTP API, relay its KV events.

Requests (``--request-transport nats``): subscribe ``infera.req.<worker>``; for each request
POST the body to the engine (path from the request's headers), stream the engine's answer to
the reply subject in :mod:`infera.protocols.nats_wire` frames. A cancel on
``infera.cancel.<worker>`` naming that reply subject closes the engine stream, which engines
treat as a client disconnect and abort the generation; so does losing the broker, since
nobody could read the answer.

KV events (``--kv-event-transport nats``): follow the engine's ZMQ PUB socket and publish each
batch to ``infera.kv.events.<worker>`` with the engine's sequence number; answer replay
requests on ``infera.kv.replay.<worker>`` from the engine's replay socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Coroutine
from typing import Any

import aiohttp
import nats
import uvicorn
import zmq
import zmq.asyncio
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from opentelemetry.trace import SpanKind

from infera.config.worker import WorkerFleetSettings
from infera.protocols import nats_wire as wire
from infera.protocols.kv_events import REPLAY_END_SEQ, seq_from_bytes
from infera.protocols.worker import WorkerRecord
from infera.telemetry.setup import tracing_for
from infera.telemetry.spans import Span, Tracing, traceparent

log = logging.getLogger(__name__)

RECONNECT_WAIT = 0.5
REPLAY_TIMEOUT = 1.0  # seconds the engine's replay socket may take between two answers
MAX_FRAME = 512 * 1024  # engine bytes per NATS message (the broker's default limit is 1 MiB)
_SKIP_HEADERS = frozenset({wire.PATH_HEADER.lower(), "content-length", "host"})


@dataclasses.dataclass(frozen=True)
class ZmqFeed:
    """Where the engine publishes KV events, and where the relay republishes them."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    subject: str


class NatsBridge:
    def __init__(self, url: str, engine_url: str, request_subject: str | None, kv: ZmqFeed | None,
                 connect_timeout: float = 10.0, tracing: Tracing | None = None) -> None:
        """``tracing``: each request gets a span continuing the frontend's leg (its ``traceparent`` header),
        and the engine is asked to continue that span."""
        self._url = url
        self._engine = engine_url.rstrip("/")
        self._req_subject = request_subject
        self._kv = kv
        self._connect_timeout = connect_timeout
        self._tracing = tracing
        self._nc: Client | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        try:
            self._nc = await nats.connect(
                self._url, name="infera-worker", connect_timeout=self._connect_timeout, allow_reconnect=True,
                max_reconnect_attempts=-1, reconnect_time_wait=RECONNECT_WAIT,
                disconnected_cb=self._on_disconnected, error_cb=self._on_error)
        except (OSError, NatsError) as exc:
            raise OSError(f"cannot reach the NATS broker at {self._url}: {exc}") from exc
        nc = self._nc
        if self._req_subject:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0), auto_decompress=False)
            await nc.subscribe(wire.cancel_subject(self._req_subject), cb=self._on_cancel)
            await nc.subscribe(self._req_subject, cb=self._on_request)
        if self._kv is not None:
            self._ctx = zmq.asyncio.Context()
            await nc.subscribe(wire.kv_replay_subject(self._kv.subject), cb=self._on_replay)
            self._spawn(self._relay(self._kv))
        await nc.flush()
        log.info("NATS bridge on %s: requests %s, KV events %s", self._url, self._req_subject or "-",
                 self._kv.subject if self._kv else "-")

    async def stop(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(NatsError, OSError):
                await self._nc.drain()
        for task in [*self._tasks, *self._inflight.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._inflight.values(), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
        self._nc = self._session = self._ctx = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _on_disconnected(self) -> None:
        if self._inflight:
            log.warning("NATS connection lost; aborting %d requests nobody can read now", len(self._inflight))
        for task in list(self._inflight.values()):
            task.cancel()

    async def _on_error(self, exc: Exception) -> None:
        log.debug("NATS: %s", exc)

    # ---- requests ----------------------------------------------------------------------------

    async def _on_request(self, msg: Msg) -> None:
        if not msg.reply:
            return
        reply = msg.reply
        task = asyncio.get_running_loop().create_task(self._serve(msg))
        self._inflight[reply] = task
        task.add_done_callback(lambda _: self._inflight.pop(reply, None))

    async def _on_cancel(self, msg: Msg) -> None:
        task = self._inflight.get(msg.data.decode("utf-8", "replace"))
        if task is not None:
            log.debug("cancel for %s: closing the engine stream", msg.data)
            task.cancel()

    async def _serve(self, msg: Msg) -> None:
        nc, session = self._nc, self._session
        assert nc is not None and session is not None
        headers = msg.headers or {}
        path = headers.get(wire.PATH_HEADER, "/v1/chat/completions")
        fwd = {k: v for k, v in headers.items() if k.lower() not in _SKIP_HEADERS}
        tracing = self._tracing
        span = self._span(tracing, headers, path) if tracing is not None else None
        if span is not None:
            fwd["traceparent"] = traceparent(span.context)
        try:
            async with session.post(self._engine + path, data=msg.data, headers=fwd) as resp:
                await nc.publish(msg.reply, wire.encode_head(resp.status, resp.headers.get("Content-Type", "")))
                first = True
                async for chunk in resp.content.iter_any():
                    if first and span is not None:
                        span.event("first_byte")
                    first = False
                    for i in range(0, len(chunk), MAX_FRAME):
                        await nc.publish(msg.reply, wire.DATA + chunk[i:i + MAX_FRAME])
                if span is not None:
                    span.attributes["http.response.status_code"] = resp.status
            await nc.publish(msg.reply, wire.END)
        except asyncio.CancelledError:
            if span is not None:
                span.error("cancelled")
            raise  # cancelled by the frontend or a lost broker: leaving the block closed the engine stream
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as exc:
            if span is not None:
                span.error(str(exc))
            with contextlib.suppress(NatsError, OSError):
                await nc.publish(msg.reply, wire.FAIL + f"engine at {self._engine} failed: {exc}".encode())
        except NatsError as exc:
            log.warning("could not stream a reply over NATS: %s", exc)
        finally:
            if tracing is not None and span is not None:
                tracing.end(span)

    def _span(self, tracing: Tracing, headers: dict[str, str], path: str) -> Span | None:
        _, span = tracing.root("nats bridge", headers.get("traceparent"), headers.get("tracestate"), SpanKind.SERVER,
                               {"infera.subject": self._req_subject or "", "url.path": path})
        return span

    # ---- KV events ---------------------------------------------------------------------------

    async def _relay(self, feed: ZmqFeed) -> None:
        assert self._ctx is not None and self._nc is not None
        nc = self._nc
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, feed.topic.encode())
        sub.connect(feed.endpoint)
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                # A publish while the broker is away fails; the frontend sees the gap and asks for a replay.
                with contextlib.suppress(NatsError, OSError):
                    await nc.publish(feed.subject, frames[1] + frames[2])
        finally:
            sub.close(linger=0)

    async def _on_replay(self, msg: Msg) -> None:
        if msg.reply and len(msg.data) == 8:
            self._spawn(self._replay(msg.reply, msg.data))

    async def _replay(self, reply: str, start: bytes) -> None:
        """Forward the engine's replay of ``start`` onwards to ``reply``, then the end marker."""
        assert self._ctx is not None and self._nc is not None
        nc = self._nc
        feed = self._kv
        try:
            if feed is not None and feed.replay_endpoint:
                dealer = self._ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(feed.replay_endpoint)
                try:
                    await dealer.send_multipart([b"", start])
                    while await dealer.poll(int(REPLAY_TIMEOUT * 1000)):
                        frames = await dealer.recv_multipart()
                        if len(frames) != 4:
                            continue
                        if seq_from_bytes(frames[2]) == REPLAY_END_SEQ:
                            break
                        await nc.publish(reply, frames[2] + frames[3])
                finally:
                    dealer.close(linger=0)
            await nc.publish(reply, wire.REPLAY_END)
        except (NatsError, OSError) as exc:
            log.warning("could not answer a KV-event replay request: %s", exc)


def serve_with_bridge(server: uvicorn.Server, bridge: NatsBridge) -> None:
    """Run an in-process engine's ``server`` and, once it listens, ``bridge`` beside it; stop both together."""

    async def main() -> None:
        serving = asyncio.ensure_future(server.serve())
        while not server.started and not serving.done():  # noqa: ASYNC110 (uvicorn has no "listening" event)
            await asyncio.sleep(0.02)
        if serving.done():
            return await serving
        try:
            await bridge.start()
        except OSError:
            server.should_exit = True
            await serving
            raise
        try:
            await serving
        finally:
            await bridge.stop()

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(main())


def with_nats_subjects(record: WorkerRecord, settings: WorkerFleetSettings) -> WorkerRecord:
    """``record`` advertising the NATS subjects this worker serves on (per its transport flags)."""
    update: dict[str, str] = {}
    if settings.request_transport == "nats":
        update["nats_subject"] = wire.request_subject(record.instance_id)
    if settings.kv_event_transport == "nats" and record.kv_events is not None:
        update["nats_kv_subject"] = wire.kv_events_subject(record.instance_id)
    return record.model_copy(update=update) if update else record


def bridge_for(record: WorkerRecord, settings: WorkerFleetSettings, engine_url: str = "") -> NatsBridge | None:
    """The bridge a worker with ``record`` (see :func:`with_nats_subjects`) needs; None when not on NATS."""
    ev = record.kv_events
    feed = (ZmqFeed(ev.endpoint, ev.replay_endpoint, ev.topic, record.nats_kv_subject)
            if ev is not None and record.nats_kv_subject else None)
    if not record.nats_subject and feed is None:
        return None
    tracing = tracing_for(settings.otel_exporter, "infera-worker") if record.nats_subject else None
    return NatsBridge(settings.nats_server, engine_url or record.http_url, record.nats_subject, feed, tracing=tracing)
