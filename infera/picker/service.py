"""The ext_proc v3 service: one gRPC stream per HTTP request the gateway holds.

Envoy sends the request headers, then the buffered body; the picker answers the body with the
picked endpoint (``x-gateway-destination-endpoint``, with fallbacks, and the same value in the
``envoy.lb`` dynamic metadata) and the worker headers the sidecar obeys. It then follows the
response (headers, streamed body, trailers) to release the load it placed when the response
ends; a stream that ends early (client abort, proxy error) releases it too.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Callable

import grpclib.const
import grpclib.server

from infera.picker import wire
from infera.picker.metrics import PickerMetrics
from infera.picker.placement import Placement, Placer, RoutingError, status_of
from infera.picker.requests import BadRequest, error_json, route_request
from infera.protocols.worker import WorkerRecord
from infera.router.errors import NoWorkers
from infera.telemetry.record import RequestRecord, bind, unbind
from infera.telemetry.tracing import Telemetry

log = logging.getLogger(__name__)

WORKER_HEADER = "x-worker-instance-id"
PREFILL_HEADER = "x-prefill-instance-id"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


class Targets:
    """Where the gateway reaches a worker: its record's ``gateway_target``, else its host and a port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port

    def of(self, worker: WorkerRecord) -> str:
        if worker.gateway_target:
            return worker.gateway_target
        hostport = worker.http_url.split("://", 1)[-1].split("/", 1)[0]
        host, _, port = hostport.rpartition(":")
        if not host:
            host, port = hostport, "80"
        return f"{host}:{self.target_port or port}"


class ExtProc:
    """The ``envoy.service.ext_proc.v3.ExternalProcessor`` service (a grpclib mapping)."""

    def __init__(self, placer: Placer, targets: Targets, metrics: PickerMetrics, *, header: str, namespace: str,
                 subset_namespace: str, fallbacks: int, strip: tuple[str, ...] = (),
                 telemetry: Telemetry | None = None) -> None:
        """``telemetry``, when active: a span per pick (continuing the request's ``traceparent``, with the
        router's tokenize and pick spans under it, handed on to the sidecar) and a line per request."""
        self.placer = placer
        self.targets = targets
        self.metrics = metrics
        self.header = header
        self.namespace = namespace
        self.subset_namespace = subset_namespace
        self.fallbacks = fallbacks
        self.patterns = [re.compile(p) for p in strip if p]
        self.telemetry = telemetry if telemetry is not None and telemetry.active else None

    async def process(self, messages: AsyncIterator[wire.Request]) -> AsyncIterator[wire.Reply]:
        """One stream: a reply per message that needs one; the load is released however it ends."""
        flow = Flow(self)
        self.metrics.streams.inc()
        try:
            async for msg in messages:
                reply = flow.handle(msg)
                if reply is not None:
                    yield reply
        finally:
            self.metrics.streams.dec()
            flow.close()

    async def _serve(self, stream: grpclib.server.Stream[wire.Request, wire.Reply]) -> None:
        async for reply in self.process(stream.__aiter__()):
            await stream.send_message(reply)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {PROCESS: grpclib.const.Handler(self._serve, grpclib.const.Cardinality.STREAM_STREAM,
                                               wire.Request, wire.Reply)}


class Flow:
    """One HTTP request's conversation with the proxy."""

    def __init__(self, service: ExtProc) -> None:
        self.s = service
        self.path = ""
        self.subset: list[str] | None = None
        self.body = bytearray()
        self.placement: Placement | None = None
        self.trace_headers: dict[str, str] = {}
        self.record: RequestRecord | None = None

    def handle(self, msg: wire.Request) -> wire.Reply | None:
        phase = msg.phase
        if phase == "request_headers":
            self.path = msg.headers.get(":path", "")
            if self.s.telemetry is not None:
                self.trace_headers = {k: v for k in ("traceparent", "tracestate", "x-request-id")
                                      if (v := msg.headers.get(k)) is not None}
            self.subset = _subset(msg.metadata.get(self.s.subset_namespace, {}).get(SUBSET_KEY))
            if msg.end_of_stream:
                return self.pick(phase)
            return wire.proceed(phase)
        if phase == "request_body":
            self.body += msg.body
            if not msg.end_of_stream:
                return None  # streamed body mode: answer once the whole body is in
            return self.pick(phase)
        if phase == "response_headers":
            self.on_response_headers(msg)
            if msg.end_of_stream:
                self.close()
        elif phase == "response_body":
            if self.placement is not None:
                self.placement.first_byte()
            if msg.end_of_stream:
                self.close()
        elif phase == "response_trailers":
            self.close()
        elif phase != "request_trailers":
            return None
        return wire.proceed(phase)

    def pick(self, phase: str) -> wire.Reply:
        telemetry = self.s.telemetry
        if telemetry is None:
            return self._timed_pick(phase)
        h = self.trace_headers
        record = self.record = telemetry.begin("endpoint picker", h.get("traceparent"), h.get("x-request-id"),
                                               {"url.path": self.path}, h.get("tracestate"))
        token = bind(record)
        try:
            return self._timed_pick(phase)
        finally:
            unbind(token)

    def _end_record(self) -> None:
        record, self.record = self.record, None
        if record is not None and self.s.telemetry is not None:
            self.s.telemetry.end(record, self.path)

    def _timed_pick(self, phase: str) -> wire.Reply:
        started = time.perf_counter()
        try:
            reply = self._pick(phase)
        except RoutingError as exc:
            status = status_of(exc)
            self.s.metrics.picks.labels("unavailable" if status == 503 else "refused").inc()
            status, body = error_json(self.path, status, str(exc))
            return self._answer(status, body, str(exc))
        except BadRequest as exc:
            self.s.metrics.picks.labels("bad_request").inc()
            status, body = error_json(self.path, 400, str(exc))
            return self._answer(status, body, str(exc))
        self.s.metrics.pick_seconds.observe(time.perf_counter() - started)
        return reply

    def _answer(self, status: int, body: bytes, details: str) -> wire.Reply:
        """The picker answers the client itself (an error): the request ends here."""
        if self.record is not None:
            self.record.status = status
            self.record.error = details
            self._end_record()
        return wire.immediate(status, body, details)

    def _allowed(self) -> Callable[[WorkerRecord], bool] | None:
        if self.subset is None:
            return None
        allowed = set(self.subset)
        targets = self.s.targets
        return lambda w: targets.of(w) in allowed

    def _pick(self, phase: str) -> wire.Reply:
        s = self.s
        allowed = self._allowed()
        req = route_request(self.path, bytes(self.body), s.patterns)
        if req is None:  # no prompt to place (e.g. /v1/models): any allowed worker's sidecar answers it
            workers = s.placer.least_loaded(allowed)
            if not workers:
                raise NoWorkers("no workers are available")
            s.metrics.picks.labels("passthrough").inc()
            return self._route(workers[0], None, workers[1:1 + s.fallbacks], phase)
        placement = s.placer.place(req, allowed, s.fallbacks)
        self.placement = placement
        s.metrics.picks.labels("placed").inc()
        return self._route(placement.worker, placement.prefill, placement.fallbacks, phase)

    def _route(self, worker: WorkerRecord, prefill: WorkerRecord | None, fallbacks: list[WorkerRecord],
               phase: str) -> wire.Reply:
        s = self.s
        endpoints = ",".join(s.targets.of(w) for w in [worker, *fallbacks])
        headers = [(s.header, endpoints)]
        if not fallbacks:
            # With fallbacks the proxy may retry on another pod, whose sidecar must then serve its own
            # worker (--direct-default-worker): a fixed worker header would send it back to the dead one.
            headers.append((WORKER_HEADER, worker.instance_id))
        if prefill is not None:
            headers.append((PREFILL_HEADER, prefill.instance_id))
        record = self.record
        if record is not None:
            record.workers = [w.instance_id for w in (prefill, worker) if w is not None]
            if record.root is not None:  # the sidecar's spans continue the pick's
                headers.append(("traceparent", record.traceparent(record.root)))
        log.debug("%s -> %s (%s)", self.path, endpoints, worker.instance_id)
        return wire.route_to(phase, headers, {s.namespace: {s.header: endpoints}})

    def on_response_headers(self, msg: wire.Request) -> None:
        placement = self.placement
        if placement is None:
            return
        served = msg.metadata.get(self.s.namespace, {}).get(SERVED_KEY)
        if isinstance(served, str) and served != self.s.targets.of(placement.worker):
            worker = next((w for w in placement.fallbacks if self.s.targets.of(w) == served), None)
            if worker is not None:
                placement.served_by(worker)
        status = msg.headers.get(":status", "200")
        if self.record is not None and status.isdigit():
            self.record.status = int(status)
        if status.isdigit() and int(status) >= 500:
            placement.failed()
        else:
            placement.first_byte()

    def close(self) -> None:
        if self.placement is not None:
            self.placement.release()
        self._end_record()


def _subset(value: object) -> list[str] | None:
    """The endpoints the proxy allows (None when it passes no subset)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list):
        return [str(v) for v in value]
    return []
