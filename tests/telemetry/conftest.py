"""A frontend app in process with the SDK's in-memory span exporter and a JSON request log in a buffer."""

from __future__ import annotations

import io
import random
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infera.kv.tokenizer import PromptRenderer
from infera.protocols.worker import WorkerRecord
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app
from infera.telemetry.logs import RequestLog
from infera.telemetry.spans import Tracing
from infera.telemetry.tracing import Telemetry
from infera.transport.base import UpstreamError, UpstreamResponse
from tests.fakes import FakeFleet, FakeTransport


class FailFirst(FakeTransport):
    """Fails the first send (502 before any byte), whatever the worker; answers the rest."""

    async def send(self, worker: WorkerRecord, path: str, body: bytes, headers: Mapping[str, str],
                   started: float | None = None) -> UpstreamResponse:
        if not self.calls:
            await super().send(worker, path, body, headers, started)  # recorded, then thrown away
            self.open -= 1
            raise UpstreamError(f"worker {worker.instance_id} is unreachable", status=502)
        return await super().send(worker, path, body, headers, started)


class Traced:
    """The app, its spans and its request lines."""

    def __init__(self, *workers: WorkerRecord, transport: Any = None, policy: str = "round-robin",
                 renderer: PromptRenderer | None = None, tracing: bool = True,
                 processor: SpanProcessor | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.log = io.BytesIO()
        self.tracing = Tracing(processor or SimpleSpanProcessor(self.exporter))
        telemetry = Telemetry(self.tracing if tracing else None, RequestLog("json", self.log))
        self.transport = transport or FakeTransport(text="hello there")
        self.router = Router(FakeFleet(*workers), self.transport, None, renderer,
                             RouterOptions(policy=policy), rng=random.Random(1))
        self.app = build_app(self.router, max_body_bytes=1 << 16, strip_patterns=[], telemetry=telemetry)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://infera")

    def spans(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    def lines(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.log.getvalue().splitlines()]


def tree(spans: Sequence[ReadableSpan]) -> dict[str, list[str]]:
    """Span name -> the names of its children, in start order (one trace)."""
    by_id = {s.context.span_id: s for s in spans}
    out: dict[str, list[str]] = {s.name: [] for s in spans}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        if s.parent is not None and s.parent.span_id in by_id:
            out[by_id[s.parent.span_id].name].append(s.name)
    return out


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r} in {[s.name for s in spans]}"
    return found[0]
