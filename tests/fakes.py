"""Fakes at the router's seams, for the in-process tier: a static fleet, a scripted transport.

``FakeTransport`` answers each worker as its script says: ``ok`` (an SSE or JSON answer),
``fail`` (502 before the first byte), ``busy`` (429: the worker is at its max pending),
``silent`` (headers, then no first byte: the transport's first-byte deadline fires, as the real
transports own that deadline), ``hang`` (never
answers: only cancellation ends it), ``endless`` (one SSE chunk, then nothing until
closed), or an ``(status, body)`` tuple relayed as is. It counts open responses, so a test
can assert that every path released what it opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socketserver
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import orjson

from infera.discovery.base import FleetListener, WorkerTable
from infera.protocols.worker import KvEventEndpoint, WorkerRecord
from infera.router.context import RouteRequest
from infera.transport.base import UpstreamError, UpstreamResponse

MODEL = "m"


def worker(wid: str, role: str = "mixed", *, model: str = MODEL, engine: str = "mock", connector: str | None = None,
           events: bool = False, **extra: Any) -> WorkerRecord:
    kv = KvEventEndpoint(endpoint=f"tcp://127.0.0.1:1/{wid}") if events else None
    return WorkerRecord(instance_id=wid, model=model, role=role, engine=engine, http_url=f"http://{wid}.invalid",
                        connector=connector, kv_events=kv, **extra)


class FakeFleet:
    """A static fleet a test can change: ``add`` and ``remove`` tell listeners as a real view does."""

    def __init__(self, *workers: WorkerRecord) -> None:
        self.table = WorkerTable(log_changes=False)
        for w in workers:
            self.table.upsert(w)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def workers(self) -> dict[str, WorkerRecord]:
        return self.table.workers()

    def subscribe(self, listener: FleetListener) -> None:
        self.table.subscribe(listener)

    def add(self, record: WorkerRecord) -> None:
        self.table.upsert(record)

    def remove(self, worker_id: str) -> None:
        self.table.drop(worker_id, "test")


def sse(*texts: str) -> list[bytes]:
    """OpenAI chat SSE chunks for ``texts``, then [DONE]."""
    chunks = [b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                                        "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]})
              + b"\n\n" for t in texts]
    final = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
             "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": len(texts), "total_tokens": 3 + len(texts)}}
    return [*chunks, b"data: " + orjson.dumps(final) + b"\n\n", b"data: [DONE]\n\n"]


def chat_json(text: str) -> bytes:
    return orjson.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})


@dataclasses.dataclass
class Call:
    worker: str
    path: str
    body: dict[str, Any]
    headers: Mapping[str, str]


class FakeTransport:
    def __init__(self, script: Mapping[str, Any] | None = None, default: Any = "ok", text: str = "hello",
                 first_byte_timeout: float = 600.0) -> None:
        self.first_byte_timeout = first_byte_timeout
        self.script = dict(script or {})
        self.default = default
        self.text = text
        self.calls: list[Call] = []
        self.open = 0  # responses sent and not yet closed
        self.sent = asyncio.Event()  # set at the first send

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def tried(self) -> list[str]:
        return [c.worker for c in self.calls]

    async def send(self, worker: WorkerRecord, path: str, body: bytes, headers: Mapping[str, str],
                   started: float | None = None) -> UpstreamResponse:
        wid = worker.instance_id
        payload = orjson.loads(body)
        self.calls.append(Call(wid, path, payload, headers))
        self.sent.set()
        action = self.script.get(wid, self.default)
        if action == "fail":
            raise UpstreamError(f"worker {wid} is unreachable", status=502)
        if action == "busy":
            raise UpstreamError(f"worker {wid} is at its max pending requests", status=429)
        if action == "hang":
            await asyncio.Event().wait()
        if isinstance(action, tuple):
            status, data = action
            return self._response(status, "application/json", [data])
        if action == "silent":
            return self._response(200, "text/event-stream", [], stall=True, worker=wid)
        if action == "endless":
            return self._response(200, "text/event-stream", sse(self.text)[:1], stall_after=True)
        if payload.get("stream"):
            return self._response(200, "text/event-stream", sse(*self.text.split()))
        if path == "/v1/completions":
            data = orjson.dumps({"id": "c", "object": "text_completion", "created": 0, "model": MODEL,
                                 "choices": [{"index": 0, "text": self.text, "finish_reason": "stop"}],
                                 "kv_transfer_params": {"remote_engine_id": wid}})
            return self._response(200, "application/json", [data])
        return self._response(200, "application/json", [chat_json(self.text)])

    def _response(self, status: int, content_type: str, chunks: list[bytes], stall: bool = False,
                  stall_after: bool = False, worker: str = "") -> UpstreamResponse:
        self.open += 1
        closed = False
        gate = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            if stall:
                try:
                    await asyncio.wait_for(gate.wait(), self.first_byte_timeout)
                except TimeoutError:
                    raise UpstreamError(f"worker {worker} sent no first byte within {self.first_byte_timeout:g}s",
                                        status=504) from None
            for chunk in chunks:
                if closed:
                    return
                yield chunk
            if stall_after:
                await gate.wait()
            for _ in range(5):  # like a socket's, the body's end comes some loop turns after its last bytes
                await asyncio.sleep(0)

        def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                self.open -= 1
                gate.set()

        return UpstreamResponse(status=status, content_type=content_type, body=body(), close=close)


def chat_request(text: str = "hi", *, stream: bool = False, worker: str | None = None,
                 prefill: str | None = None, model: str = MODEL, max_tokens: int = 8) -> RouteRequest:
    payload = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
               "stream": stream}
    return RouteRequest(kind="chat", path="/v1/chat/completions", body=orjson.dumps(payload), payload=payload,
                        model=model, max_tokens=max_tokens, worker_hint=worker, prefill_hint=prefill)


def completion_request(prompt: str = "hi", *, model: str = MODEL) -> RouteRequest:
    payload = {"model": model, "prompt": prompt, "max_tokens": 4}
    return RouteRequest(kind="completion", path="/v1/completions", body=orjson.dumps(payload), payload=payload,
                        model=model, max_tokens=4)


class FakeEvents:
    """A KV-event source that records which workers are watched; a test pushes batches through ``sink``."""

    def __init__(self) -> None:
        self.watched: set[str] = set()
        self.sink: Any = None
        self.on_gap: Any = None

    def bind(self, sink: Any, on_gap: Any, raw: Any = None, socket: Any = None, stream: Any = None,
             ready: Any = None) -> None:
        self.sink, self.on_gap, self.raw = sink, on_gap, raw

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def watch(self, worker: WorkerRecord) -> None:
        if worker.kv_events is not None:
            self.watched.add(worker.instance_id)

    def unwatch(self, worker_id: str) -> None:
        self.watched.discard(worker_id)

    def catch_up(self) -> None:
        pass


class _Drain(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.rfile.read()


@contextlib.contextmanager
def kvd_stub(path: str) -> Iterator[str]:
    """A stand-in KV daemon, in this process: a Unix socket at ``path`` that takes hint lines and
    answers nothing."""
    server = socketserver.ThreadingUnixStreamServer(path, _Drain)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
