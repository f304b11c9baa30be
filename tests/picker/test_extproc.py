"""The picker's ext_proc conversation in process: what Envoy would read back, and the load it holds."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

import pytest
from envoy_data_plane.envoy.config.core.v3 import HeaderMap, HeaderValue, Metadata
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    ExternalProcessorAsyncStub,
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
)
from envoy_data_plane.google.protobuf import Struct
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.server import Server

from infera.discovery.base import FleetListener
from infera.picker import wire
from infera.picker.health import Health, HealthCheckRequest, HealthCheckResponse
from infera.picker.metrics import PickerMetrics
from infera.picker.placement import Placer
from infera.picker.service import ExtProc, Targets
from infera.protocols.worker import WorkerRecord
from infera.router.router import Router, RouterOptions


class Fleet:
    def __init__(self, workers: Sequence[WorkerRecord]) -> None:
        self._workers = {w.instance_id: w for w in workers}

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def workers(self) -> dict[str, WorkerRecord]:
        return self._workers

    def subscribe(self, listener: FleetListener) -> None: ...


def worker(wid: str, port: int, role: str = "mixed") -> WorkerRecord:
    return WorkerRecord(instance_id=wid, model="m", role=role, http_url=f"http://10.0.0.{port}:8000",  # type: ignore[arg-type]
                        gateway_target=f"10.0.0.{port}:8080", connector="pull" if role != "mixed" else None)


def picker(workers: Sequence[WorkerRecord], fallbacks: int = 0) -> ExtProc:
    router = Router(Fleet(workers), transport=None, events=None, renderer=None,  # type: ignore[arg-type]
                    options=RouterOptions(policy="round-robin"))
    placer = Placer(router)
    metrics = PickerMetrics(placer.in_flight, lambda: len(placer.workers()))
    return ExtProc(placer, Targets(0), metrics, header="x-gateway-destination-endpoint", namespace="envoy.lb",
                   subset_namespace="envoy.lb.subset_hint", fallbacks=fallbacks)


def headers(path: str, *, end: bool = False, subset: list[str] | None = None) -> ProcessingRequest:
    hmap = HeaderMap(headers=[HeaderValue(key=":path", raw_value=path.encode()),
                              HeaderValue(key=":method", raw_value=b"POST")])
    meta = None
    if subset is not None:
        meta = Metadata(filter_metadata={"envoy.lb.subset_hint": Struct.from_dict(
            {"x-gateway-destination-endpoint-subset": subset})})
    return ProcessingRequest(request_headers=HttpHeaders(headers=hmap, end_of_stream=end), metadata_context=meta)


def body(doc: object) -> ProcessingRequest:
    return ProcessingRequest(request_body=HttpBody(body=json.dumps(doc).encode(), end_of_stream=True))


def response(status: int = 200) -> list[ProcessingRequest]:
    hmap = HeaderMap(headers=[HeaderValue(key=":status", raw_value=str(status).encode())])
    return [ProcessingRequest(response_headers=HttpHeaders(headers=hmap)),
            ProcessingRequest(response_body=HttpBody(body=b"data: x\n\n")),
            ProcessingRequest(response_body=HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True))]


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def feed(items: Sequence[ProcessingRequest]) -> AsyncIterator[wire.Request]:
    """Envoy's messages as the picker reads them off the wire (encoded by envoy-data-plane)."""
    for item in items:
        yield wire.Request.FromString(bytes(item))


async def exchange(service: ExtProc, items: Sequence[ProcessingRequest]) -> list[ProcessingResponse]:
    """The picker's replies, decoded by envoy-data-plane as Envoy would read them."""
    return [ProcessingResponse.FromString(r.data) async for r in service.process(feed(items))]


def set_headers(reply: ProcessingResponse) -> dict[str, str]:
    common = (reply.request_body or reply.request_headers).response  # type: ignore[union-attr]
    assert common is not None and common.header_mutation is not None
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers if h.header}


async def test_a_request_is_routed_to_the_picked_pod_and_its_load_is_held_until_the_response_ends() -> None:
    service = picker([worker("a", 1), worker("b", 2)])
    gen = service.process(feed([headers("/v1/chat/completions"), body(CHAT), *response()]))
    replies = [ProcessingResponse.FromString((await anext(gen)).data) for _ in range(2)]
    picked = set_headers(replies[1])
    assert picked["x-gateway-destination-endpoint"] in {"10.0.0.1:8080", "10.0.0.2:8080"}
    assert picked["x-worker-instance-id"] == {"10.0.0.1:8080": "a", "10.0.0.2:8080": "b"}[
        picked["x-gateway-destination-endpoint"]]
    assert replies[1].dynamic_metadata is not None
    assert replies[1].dynamic_metadata.to_dict() == {
        "envoy.lb": {"x-gateway-destination-endpoint": picked["x-gateway-destination-endpoint"]}}
    assert service.placer.in_flight() == 1
    rest = [r async for r in gen]
    assert len(rest) == 3
    assert service.placer.in_flight() == 0


async def test_a_stream_that_ends_early_releases_the_load() -> None:
    service = picker([worker("a", 1)])
    await exchange(service, [headers("/v1/chat/completions"), body(CHAT)])  # the proxy hangs up: client abort
    assert service.placer.in_flight() == 0
    assert service.metrics.streams._value.get() == 0


async def test_the_proxys_endpoint_subset_bounds_the_pick() -> None:
    service = picker([worker("a", 1), worker("b", 2)])
    for _ in range(3):
        replies = await exchange(service, [headers("/v1/chat/completions", subset=["10.0.0.2:8080"]),
                                           body(CHAT)])
        assert set_headers(replies[1])["x-worker-instance-id"] == "b"
    replies = await exchange(service, [headers("/v1/chat/completions", subset=[]), body(CHAT)])
    assert replies[1].immediate_response is not None
    assert replies[1].immediate_response.status is not None
    assert replies[1].immediate_response.status.code.value == 503


async def test_no_capacity_is_an_immediate_503_in_the_shape_of_the_api() -> None:
    service = picker([])
    replies = await exchange(service, [headers("/v1/chat/completions"), body(CHAT)])
    imm = replies[1].immediate_response
    assert imm is not None and imm.status is not None and imm.status.code.value == 503
    assert json.loads(imm.body)["error"]["type"] == "service_unavailable"
    anthropic = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    replies = await exchange(service, [headers("/v1/messages"), body(anthropic)])
    imm = replies[1].immediate_response
    assert imm is not None and imm.status is not None and imm.status.code.value == 503
    assert json.loads(imm.body) == {"type": "error", "error": {"type": "overloaded_error",
                                                               "message": "no workers are available"}}


async def test_a_pd_pair_names_both_workers() -> None:
    service = picker([worker("p", 1, "prefill"), worker("d", 2, "decode")])
    replies = await exchange(service, [headers("/v1/chat/completions"), body(CHAT)])
    picked = set_headers(replies[1])
    assert picked == {"x-gateway-destination-endpoint": "10.0.0.2:8080", "x-worker-instance-id": "d",
                      "x-prefill-instance-id": "p"}


async def test_fallback_endpoints_follow_the_pick_and_name_no_worker() -> None:
    service = picker([worker("a", 1), worker("b", 2), worker("c", 3)], fallbacks=1)
    replies = await exchange(service, [headers("/v1/chat/completions"), body(CHAT)])
    picked = set_headers(replies[1])
    endpoints = picked["x-gateway-destination-endpoint"].split(",")
    assert len(endpoints) == 2 and len(set(endpoints)) == 2
    assert "x-worker-instance-id" not in picked


async def test_a_request_without_a_body_goes_to_any_pod() -> None:
    service = picker([worker("a", 1)])
    replies = await exchange(service, [headers("/v1/models", end=True)])
    assert set_headers(replies[0])["x-gateway-destination-endpoint"] == "10.0.0.1:8080"


@pytest.mark.timeout(30)
async def test_over_grpc_with_health_under_the_stock_epps_names() -> None:
    service = picker([worker("a", 1)])
    ready = False
    server = Server([service, Health(lambda: ready)])
    await server.start("127.0.0.1", 0)
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    channel = Channel("127.0.0.1", port)
    try:
        stub = ExternalProcessorAsyncStub(channel)
        replies = [r async for r in stub.process([headers("/v1/chat/completions"), body(CHAT), *response()])]
        assert set_headers(replies[1])["x-worker-instance-id"] == "a"
        statuses = {}
        for name in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            async with channel.request("/grpc.health.v1.Health/Check", Cardinality.UNARY_UNARY,
                                       HealthCheckRequest, HealthCheckResponse) as stream:
                await stream.send_message(HealthCheckRequest(service=name), end=True)
                reply = await stream.recv_message()
                assert reply is not None
                statuses[name] = reply.status
        assert statuses == {"liveness": 1, "readiness": 2, "envoy.service.ext_proc.v3.ExternalProcessor": 2}
    finally:
        channel.close()
        server.close()
        await server.wait_closed()
