"""gRPC health checking (grpc.health.v1) under the service names of GAIE's stock endpoint picker.

``liveness`` answers SERVING while the process runs; ``readiness`` and the ext_proc service name
answer SERVING once the picker has its fleet view (started, and at least one worker seen once).
The two messages are declared here: envoy-data-plane carries Envoy's APIs, not gRPC's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import betterproto2
import grpclib
import grpclib.const
import grpclib.server

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"

SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3


@dataclass(eq=False, repr=False)
class HealthCheckRequest(betterproto2.Message):
    service: str = betterproto2.field(1, betterproto2.TYPE_STRING)


@dataclass(eq=False, repr=False)
class HealthCheckResponse(betterproto2.Message):
    status: int = betterproto2.field(1, betterproto2.TYPE_INT32)  # ServingStatus (an enum on the wire: varint)


class Health:
    def __init__(self, ready: Callable[[], bool]) -> None:
        self.ready = ready

    def status(self, service: str) -> int:
        if service == LIVENESS:
            return SERVING
        if service in ("", READINESS, EXT_PROC_SERVICE):
            return SERVING if self.ready() else NOT_SERVING
        return SERVICE_UNKNOWN

    async def check(self, stream: grpclib.server.Stream[HealthCheckRequest, HealthCheckResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
        status = self.status(request.service)
        if status == SERVICE_UNKNOWN:
            raise grpclib.GRPCError(grpclib.const.Status.NOT_FOUND, f"unknown service {request.service!r}")
        await stream.send_message(HealthCheckResponse(status=status))

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {"/grpc.health.v1.Health/Check": grpclib.const.Handler(
            self.check, grpclib.const.Cardinality.UNARY_UNARY, HealthCheckRequest, HealthCheckResponse)}
