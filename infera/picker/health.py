"""gRPC health checking (grpc.health.v1) under the service names of GAIE's stock endpoint picker.

``liveness`` answers SERVING while the process runs; ``readiness`` and the ext_proc service name
answer SERVING once the picker has its fleet view (started, and at least one worker seen once).
The two one-field messages are encoded here (see :mod:`infera.picker.wire`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import grpclib
import grpclib.const
import grpclib.server

from infera.picker.wire import fields

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"

SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3


@dataclasses.dataclass(slots=True)
class HealthCheckRequest:
    service: str = ""

    @classmethod
    def FromString(cls, data: bytes) -> HealthCheckRequest:  # grpclib's codec calls this name
        return cls(next((v.decode() for n, _, v in fields(data) if n == 1), ""))

    def SerializeToString(self) -> bytes:
        raw = self.service.encode()
        return bytes([0x0A, len(raw)]) + raw if raw else b""  # names are < 128 bytes


@dataclasses.dataclass(slots=True)
class HealthCheckResponse:
    status: int = 0  # ServingStatus, a varint on the wire

    @classmethod
    def FromString(cls, data: bytes) -> HealthCheckResponse:
        return cls(next((v for n, _, v in fields(data) if n == 1), 0))

    def SerializeToString(self) -> bytes:
        return bytes([0x08, self.status]) if self.status else b""


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
