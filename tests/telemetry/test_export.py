"""The spans as exporters take them: OTLP encodes them, the sampler decides once per trace, and a bad
traceparent starts a new trace."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from infera.telemetry.spans import Tracing, parse_traceparent
from tests.fakes import MODEL, worker
from tests.telemetry.conftest import Traced

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_otlp_encodes_a_requests_spans_with_their_ids_events_and_attributes() -> None:
    t = Traced(worker("w1"))
    async with t.client() as client:
        await client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": PARENT})
    request = encode_spans(t.spans())
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == 5 and {s.trace_id.hex() for s in spans} == {"0af7651916cd43dd8448eb211c80319c"}
    leg = next(s for s in spans if s.name == "leg mixed")
    assert [e.name for e in leg.events] == ["first_byte"]
    assert {a.key: a.value.string_value for a in leg.attributes}["infera.worker"] == "w1"


def test_the_sampler_decides_at_the_root_and_a_callers_decision_is_followed() -> None:
    exporter = InMemorySpanExporter()
    never = Tracing(SimpleSpanProcessor(exporter), ALWAYS_OFF)
    trace_id, span = never.root("r", None)
    assert span is None and trace_id > 0
    follow = Tracing(SimpleSpanProcessor(exporter), ParentBased(TraceIdRatioBased(1.0)))
    assert follow.root("r", PARENT[:-2] + "00")[1] is None  # the caller did not sample it
    trace_id, span = follow.root("r", PARENT)
    assert span is not None and f"{trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    follow.end(span)
    follow.end(span)  # once
    assert [s.name for s in exporter.get_finished_spans()] == ["r"]


@pytest.mark.parametrize("header", ["", "junk", "00-" + "0" * 32 + "-b7ad6b7169203331-01",
                                    "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",
                                    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
                                    "00-0af7651916cd43dd8448eb211c80319x-b7ad6b7169203331-01"])
def test_an_invalid_traceparent_is_ignored(header: str) -> None:
    assert parse_traceparent(header) is None
    tracing = Tracing(SimpleSpanProcessor(InMemorySpanExporter()))
    _, span = tracing.root("r", header)
    assert span is not None and span.parent is None


def test_a_valid_traceparent_parses() -> None:
    assert parse_traceparent(PARENT) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1)


async def test_the_hand_written_otlp_encoding_equals_the_sdks_for_a_requests_spans() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from infera.telemetry.otlp import Encoder
    from tests.telemetry.conftest import FailFirst

    t = Traced(worker("w1"), worker("w2"), transport=FailFirst(text="hello there"))
    async with t.client() as client:  # a retry: an error status; a caller's traceparent and tracestate
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                          headers={"traceparent": PARENT, "tracestate": "vendor=x1"})
        await client.post("/v1/chat/completions", json=CHAT)
    spans = t.spans()
    assert any(s.status.description for s in spans) and any(s.parent and s.parent.is_remote for s in spans)
    ours = ExportTraceServiceRequest.FromString(Encoder().encode(spans))
    assert ours == encode_spans(spans)


async def test_the_otlp_processor_posts_the_encoded_spans_to_the_collector_the_environment_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import http.server
    import threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from infera.telemetry.otlp import otlp_processor
    from infera.telemetry.setup import exporter_for

    bodies: list[tuple[str, bytes]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        t = Traced(worker("w1"))
        async with t.client() as client:
            await client.post("/v1/chat/completions", json=CHAT)
        exporter = exporter_for("otlp")
        assert exporter is not None
        processor = otlp_processor(exporter)
        assert processor is not None
        for span in t.spans():
            processor.on_end(span)
        processor.shutdown()  # flushes what is pending
    finally:
        server.shutdown()
        server.server_close()
    ((path, body),) = bodies
    sent = ExportTraceServiceRequest.FromString(body)
    assert path == "/v1/traces" and sent == encode_spans(t.spans())


async def test_the_otlp_processor_encodes_a_requests_span_records_as_the_sdk_encodes_their_spans() -> None:
    """The OTLP processor takes a request's spans as records (no SDK span made) and writes them itself:
    the same message as the SDK's encoder makes of their SDK form."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from infera.telemetry.otlp import OtlpProcessor
    from infera.telemetry.spans import Span, Stage, stage_span
    from tests.telemetry.conftest import FailFirst

    posted: list[bytes] = []
    readable = []

    class Both(OtlpProcessor):  # the stages' ids from the same draws for both forms
        def _take(self, resource: Resource, scope: InstrumentationScope, root: Span,
                  children: Sequence[Span | Stage]) -> None:
            seed = random.getrandbits(32)
            bits = random.Random(seed).getrandbits
            spans = [c if isinstance(c, Span) else stage_span(root, c, bits) for c in children]
            readable.extend(t.tracing.readable(s) for s in [*spans, root])
            self._bits = random.Random(seed).getrandbits
            super()._take(resource, scope, root, children)

    processor = Both(lambda body: posted.append(body) or True, delay=3600)
    t = Traced(worker("w1"), worker("w2"), transport=FailFirst(text="hello there"), processor=processor)
    async with t.client() as client:  # a retry (an error status), a caller's traceparent and tracestate, a 400
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                          headers={"traceparent": PARENT, "tracestate": "vendor=x1"})
        await client.post("/v1/chat/completions", json=CHAT)
        await client.post("/v1/chat/completions", content=b"{not json")
    processor.shutdown()
    (body,) = posted
    assert len(readable) == 7 + 5 + 2 and any(s.status.description for s in readable)
    assert ExportTraceServiceRequest.FromString(body) == encode_spans(readable)


def test_kept_attribute_encodings_write_what_the_plain_encoder_writes() -> None:
    from infera.telemetry.otlp import Encoder

    encoder = Encoder()
    values = [0, 1, 127, 128, 200, 16383, 16384, 1 << 40, -1, True, False, 0.0, 3.25, -1e300, "", "w1", "é" * 200,
              ["a", "b"], [], ["w1", "w2"], [1, 2], [["a"], ["b"]]]
    for round_ in range(2):  # the second time from the kept encodings
        for i, value in enumerate(values):
            attributes = {f"infera.k{i}": value, "x" * 150: value, "infera.request_id": value}
            assert encoder._span_attributes(attributes) == encoder._attributes(9, attributes), (round_, value)


def test_a_stages_attributes_from_its_shape_write_what_the_plain_encoder_writes() -> None:
    """Stages carry values in their shape's key order; the encoder keeps their leading strings' encoding
    as one piece: the bytes are still those of the attributes the values stand for, first time or kept."""
    import pytest

    from infera.telemetry.otlp import Encoder
    from infera.telemetry.spans import Shape

    encoder = Encoder()
    pick = Shape(("infera.role", "infera.policy", "infera.worker", "infera.reason", "infera.overlap_blocks",
                  "infera.cost", "infera.candidates"), strings=4)
    refused = Shape(("infera.body_bytes", "infera.error", "http.response.status_code"))
    cases = [
        (pick, ("mixed", "kv-aware", "w1", "cache-hit", 6, 28.2, 2)),
        (pick, ("mixed", "kv-aware", "w2", "cache-hit", 0, 0.0, 2)),  # another worker: another kept piece
        (pick, ("decode", "kv-aware", "w1", "load", 200, -1.5, 16384)),  # two-byte and long ints
        (refused, (0, "request body exceeds 10 bytes", 413)),  # a string after the leading ones
        (Shape(("infera.prompt_tokens", "infera.tokenized")), (1000, True)),
        (Shape(("infera.body_bytes",)), (611,)),
        (Shape(("a", "b"), strings=2), ("x", "é" * 100)),  # strings only
        (Shape(("k" * 150, "n"), strings=1), ("v", 1)),  # a key too long for the short prefixes
    ]
    for round_ in range(2):  # the second time from the kept encodings
        for shape, values in cases:
            expected = encoder._attributes(9, shape.attributes(values))
            assert encoder._stage_attributes(shape, values) == expected, (round_, values)
    with pytest.raises(ValueError, match="strings=2 for 1 keys"):
        Shape(("a",), strings=2)


def test_a_new_traces_sampling_decision_is_the_samplers_without_asking_it() -> None:
    from opentelemetry.sdk.trace.sampling import (
        ALWAYS_OFF,
        ALWAYS_ON,
        DEFAULT_OFF,
        DEFAULT_ON,
        Decision,
        ParentBasedTraceIdRatio,
        Sampler,
        SamplingResult,
        TraceIdRatioBased,
    )

    from infera.telemetry.spans import root_bound

    class Odd(Sampler):  # a sampler of its own: asked every time
        def should_sample(self, *args: object, **kwargs: object) -> SamplingResult:
            return SamplingResult(Decision.RECORD_AND_SAMPLE)

        def get_description(self) -> str:
            return "odd"

    assert root_bound(Odd()) is None
    # an SDK whose samplers keep their parts elsewhere: the sampler is asked, not guessed
    for private in ("_root", "_decision"):
        stripped = copy.copy(DEFAULT_ON if private == "_root" else ALWAYS_ON)
        delattr(stripped, private)
        assert root_bound(stripped) is None, private
    rng = random.Random(7)
    for sampler in (ALWAYS_ON, ALWAYS_OFF, DEFAULT_ON, DEFAULT_OFF, TraceIdRatioBased(0.3),
                    ParentBasedTraceIdRatio(0.1)):
        bound = root_bound(sampler)
        assert bound is not None, sampler
        for _ in range(2000):
            trace_id = rng.getrandbits(128)
            ours = trace_id & ((1 << 64) - 1) < bound
            sdk = sampler.should_sample(None, trace_id, "r").decision is Decision.RECORD_AND_SAMPLE
            assert ours == sdk, (sampler, trace_id)
    sampled = Tracing(SimpleSpanProcessor(InMemorySpanExporter()), ParentBasedTraceIdRatio(0.1))
    kept = sum(sampled.root("r", None)[1] is not None for _ in range(2000))
    assert 100 < kept < 300


async def test_the_otlp_processor_encodes_on_the_event_loop_and_posts_a_batch_when_it_is_due() -> None:
    import asyncio
    import threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from infera.telemetry.otlp import OtlpProcessor
    from infera.telemetry.spans import Shape

    posted: list[bytes] = []
    processor = OtlpProcessor(lambda body: posted.append(body) or True, delay=0.05, tick=0.01)
    tracing = Tracing(processor)
    for _ in range(3):
        _, root = tracing.root("r", None)
        assert root is not None
        leg = tracing.start("leg mixed", root)
        leg.close()
        root.close()
        tracing.emit(root, [leg, ("pick", root.start, root.end, Shape(("infera.worker",), strings=1), ("w1",))])
    for _ in range(500):  # bounded wait for the batch to be due and posted
        if posted:
            break
        await asyncio.sleep(0.01)
    (body,) = posted  # one post for the three requests
    spans = [s for rs in ExportTraceServiceRequest.FromString(body).resource_spans for ss in rs.scope_spans
             for s in ss.spans]
    assert [s.name for s in spans] == ["leg mixed", "pick", "r"] * 3
    assert not any(t.name == "infera-otlp-encode" for t in threading.enumerate())  # the loop encoded them
    processor.shutdown()


def test_the_otlp_exporter_posts_through_urllib3_unless_requests_would_read_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from infera.telemetry.otlp import _REQUESTS_ENV, otlp_exporter

    for name in _REQUESTS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.netrc
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")  # what requests would verify with
    transport = otlp_exporter()._client._transport  # type: ignore[attr-defined]
    assert type(transport).__name__ == "Urllib3HTTPTransport"
    assert transport._pool.connection_pool_kw["ca_certs"] == "/etc/ssl/certs/ca-certificates.crt"
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # requests honours it, urllib3 would not
    transport = otlp_exporter()._client._transport  # type: ignore[attr-defined]
    assert type(transport).__name__ == "RequestsHTTPTransport"
