"""The kubelet's gRPC probe against a real grpclib server: grpc.health.v1 Check, SERVING passes."""

from __future__ import annotations

from grpclib.server import Server

from harness.kube.kubelet import grpc_serving
from harness.process import free_port
from infera.picker.health import Health


async def test_a_grpc_probe_passes_only_when_the_service_is_serving() -> None:
    ready = False
    server = Server([Health(lambda: ready)])
    port = free_port()
    await server.start("127.0.0.1", port)
    try:
        assert await grpc_serving("127.0.0.1", port, "liveness", 1.0)
        assert not await grpc_serving("127.0.0.1", port, "readiness", 1.0)
        ready = True
        assert await grpc_serving("127.0.0.1", port, "readiness", 1.0)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_grpc_probe_fails_when_nothing_listens() -> None:
    assert not await grpc_serving("127.0.0.1", free_port(), "readiness", 1.0)
