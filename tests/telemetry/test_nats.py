"""W3C trace context across NATS: the frontend's leg span -> the worker's bridge span -> the engine.

A real nats-server; the frontend's NATS request transport and the worker's bridge run in process, each
with its own tracer as in their own processes; the engine is a stub that records what it was sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from harness import NatsServer, free_port
from infera.engine.nats_bridge import NatsBridge
from infera.protocols import nats_wire as wire
from infera.telemetry.spans import Tracing
from infera.transport.nats_requests import NatsRequestTransport
from tests.fakes import MODEL, chat_json, worker
from tests.telemetry.conftest import Traced, one


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats-server.log")
    server.start()
    yield server
    server.stop()


async def test_the_traceparent_crosses_nats_to_the_bridge_and_on_to_the_engine(broker: NatsServer) -> None:
    seen: list[dict[str, str]] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(body=chat_json("hi"), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()

    worker_spans = InMemorySpanExporter()
    subject = wire.request_subject("w1")
    bridge = NatsBridge(broker.url, f"http://127.0.0.1:{port}", subject, None,
                        tracing=Tracing(SimpleSpanProcessor(worker_spans)))
    transport = NatsRequestTransport(broker.url, idle_timeout=10)
    await bridge.start()
    await transport.start()
    try:
        t = Traced(worker("w1", nats_subject=subject), transport=transport)
        async with t.client() as client:
            resp = await client.post("/v1/chat/completions",
                                     json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 200 and orjson.loads(resp.content)["choices"][0]["message"]["content"] == "hi"
    finally:
        await transport.stop()
        await bridge.stop()
        await runner.cleanup()
    leg = one(t.spans(), "leg mixed")
    bridged = one(worker_spans.get_finished_spans(), "nats bridge")
    assert bridged.kind == SpanKind.SERVER and bridged.context.trace_id == leg.context.trace_id
    assert bridged.parent is not None and bridged.parent.span_id == leg.context.span_id
    assert [e.name for e in bridged.events] == ["first_byte"]
    assert (bridged.attributes or {})["http.response.status_code"] == 200
    (engine,) = seen
    traceparent = engine.get("traceparent") or engine["Traceparent"]
    assert traceparent.split("-")[1:3] == [f"{leg.context.trace_id:032x}", f"{bridged.context.span_id:016x}"]
    assert orjson.loads(t.log.getvalue())["trace_id"] == f"{leg.context.trace_id:032x}"
