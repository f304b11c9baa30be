"""The endpoint picker's span per pick: it continues the gateway's trace, holds the router's pick spans,
and hands its own traceparent to the sidecar that serves the request."""

from __future__ import annotations

import io

import orjson
from envoy_data_plane.envoy.config.core.v3 import HeaderMap, HeaderValue
from envoy_data_plane.envoy.service.ext_proc.v3 import HttpHeaders, ProcessingRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infera.picker.metrics import PickerMetrics
from infera.picker.placement import Placer
from infera.picker.service import ExtProc, Targets
from infera.router.router import Router, RouterOptions
from infera.telemetry.logs import RequestLog
from infera.telemetry.spans import Tracing
from infera.telemetry.tracing import Telemetry
from tests.picker.test_extproc import CHAT, Fleet, body, exchange, response, set_headers, worker
from tests.telemetry.conftest import tree

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_each_pick_is_a_span_continuing_the_gateways_trace_and_handed_to_the_sidecar() -> None:
    exporter = InMemorySpanExporter()
    log = io.BytesIO()
    router = Router(Fleet([worker("a", 1), worker("b", 2)]), transport=None, events=None,  # type: ignore[arg-type]
                    renderer=None, options=RouterOptions(policy="round-robin"))
    placer = Placer(router)
    service = ExtProc(placer, Targets(0), PickerMetrics(placer.in_flight, lambda: len(placer.workers())),
                      header="x-gateway-destination-endpoint", namespace="envoy.lb",
                      subset_namespace="envoy.lb.subset_hint", fallbacks=0,
                      telemetry=Telemetry(Tracing(SimpleSpanProcessor(exporter)), RequestLog("json", log)))
    hmap = HeaderMap(headers=[HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
                              HeaderValue(key="traceparent", raw_value=PARENT.encode())])
    replies = await exchange(service, [ProcessingRequest(request_headers=HttpHeaders(headers=hmap)), body(CHAT),
                                       *response()])
    spans = exporter.get_finished_spans()
    assert tree(spans) == {"endpoint picker": ["tokenize", "pick"], "tokenize": [], "pick": []}
    root = next(s for s in spans if s.name == "endpoint picker")
    assert f"{root.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    picked = set_headers(replies[1])
    assert picked["traceparent"].split("-")[2] == f"{root.context.span_id:016x}"
    pick = next(s for s in spans if s.name == "pick")
    assert (pick.attributes or {})["infera.worker"] == picked["x-worker-instance-id"]
    line = orjson.loads(log.getvalue())
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c" and line["status"] == 200
    assert line["workers"] == [picked["x-worker-instance-id"]] and line["policy"] == "round-robin"
