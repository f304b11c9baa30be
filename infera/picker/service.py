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

from envoy_data_plane.envoy.service.ext_proc.v3 import ExternalProcessorBase, ProcessingRequest, ProcessingResponse

from infera.picker import messages
from infera.picker.metrics import PickerMetrics
from infera.picker.placement import Placement, Placer, RoutingError
from infera.picker.requests import BadRequest, error_json, route_request
from infera.protocols.worker import WorkerRecord

log = logging.getLogger(__name__)

WORKER_HEADER = "x-worker-instance-id"
PREFILL_HEADER = "x-prefill-instance-id"


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


class ExtProc(ExternalProcessorBase):
    def __init__(self, placer: Placer, targets: Targets, metrics: PickerMetrics, *, header: str, namespace: str,
                 subset_namespace: str, fallbacks: int, strip: tuple[str, ...] = ()) -> None:
        self.placer = placer
        self.targets = targets
        self.metrics = metrics
        self.header = header
        self.namespace = namespace
        self.subset_namespace = subset_namespace
        self.fallbacks = fallbacks
        self.patterns = [re.compile(p) for p in strip if p]

    async def process(self, messages: AsyncIterator[ProcessingRequest]) -> AsyncIterator[ProcessingResponse]:
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


class Flow:
    """One HTTP request's conversation with the proxy."""

    def __init__(self, service: ExtProc) -> None:
        self.s = service
        self.path = ""
        self.subset: list[str] | None = None
        self.body = bytearray()
        self.placement: Placement | None = None

    def handle(self, msg: ProcessingRequest) -> ProcessingResponse | None:
        if msg.request_headers is not None:
            headers = messages.header_dict(msg.request_headers.headers)
            self.path = headers.get(":path", "")
            self.subset = messages.subset(msg.metadata_context, self.s.subset_namespace)
            if msg.request_headers.end_of_stream:
                return self.pick(body_phase=False)
            return messages.continue_request_headers()
        if msg.request_body is not None:
            self.body += msg.request_body.body
            if not msg.request_body.end_of_stream:
                return None  # streamed body mode: answer once the whole body is in
            return self.pick(body_phase=True)
        if msg.request_trailers is not None:
            return messages.continue_trailers(response=False)
        if msg.response_headers is not None:
            self.on_response_headers(msg)
            if msg.response_headers.end_of_stream:
                self.close()
            return messages.continue_response_headers()
        if msg.response_body is not None:
            if self.placement is not None:
                self.placement.first_byte()
            if msg.response_body.end_of_stream:
                self.close()
            return messages.continue_response_body()
        if msg.response_trailers is not None:
            self.close()
            return messages.continue_trailers(response=True)
        return None

    def pick(self, *, body_phase: bool) -> ProcessingResponse:
        started = time.perf_counter()
        try:
            reply = self._pick(body_phase)
        except RoutingError as exc:
            self.s.metrics.picks.labels("unavailable" if exc.status == 503 else "refused").inc()
            status, body = error_json(self.path, exc.status, str(exc))
            return messages.immediate(status, body, str(exc))
        except BadRequest as exc:
            self.s.metrics.picks.labels("bad_request").inc()
            status, body = error_json(self.path, 400, str(exc))
            return messages.immediate(status, body, str(exc))
        self.s.metrics.pick_seconds.observe(time.perf_counter() - started)
        return reply

    def _allowed(self) -> Callable[[WorkerRecord], bool] | None:
        if self.subset is None:
            return None
        allowed = set(self.subset)
        targets = self.s.targets
        return lambda w: targets.of(w) in allowed

    def _pick(self, body_phase: bool) -> ProcessingResponse:
        s = self.s
        allowed = self._allowed()
        req = route_request(self.path, bytes(self.body), s.patterns)
        if req is None:  # no prompt to place (e.g. /v1/models): any allowed worker's sidecar answers it
            workers = sorted((w for w in s.placer.workers().values() if allowed is None or allowed(w)),
                             key=lambda w: (s.placer.router.load.in_flight(w.instance_id), w.instance_id))
            if not workers:
                raise RoutingError(503, "no workers are available")
            s.metrics.picks.labels("passthrough").inc()
            return self._route(workers[0], None, workers[1:1 + s.fallbacks], body_phase)
        placement = s.placer.place(req, allowed, s.fallbacks)
        self.placement = placement
        s.metrics.picks.labels("placed").inc()
        return self._route(placement.worker, placement.prefill, placement.fallbacks, body_phase)

    def _route(self, worker: WorkerRecord, prefill: WorkerRecord | None, fallbacks: list[WorkerRecord],
               body_phase: bool) -> ProcessingResponse:
        s = self.s
        endpoints = ",".join(s.targets.of(w) for w in [worker, *fallbacks])
        headers = {s.header: endpoints}
        if not fallbacks:
            # With fallbacks the proxy may retry on another pod, whose sidecar must then serve its own
            # worker (--direct-default-worker): a fixed worker header would send it back to the dead one.
            headers[WORKER_HEADER] = worker.instance_id
        if prefill is not None:
            headers[PREFILL_HEADER] = prefill.instance_id
        log.debug("%s -> %s (%s)", self.path, endpoints, worker.instance_id)
        return messages.route_to(headers, {s.namespace: {s.header: endpoints}}, body_phase=body_phase)

    def on_response_headers(self, msg: ProcessingRequest) -> None:
        placement = self.placement
        if placement is None or msg.response_headers is None:
            return
        served = messages.metadata_value(msg.metadata_context, self.s.namespace, messages.SERVED_KEY)
        if isinstance(served, str) and served != self.s.targets.of(placement.worker):
            worker = next((w for w in placement.fallbacks if self.s.targets.of(w) == served), None)
            if worker is not None:
                placement.served_by(worker)
        status = messages.header_dict(msg.response_headers.headers).get(":status", "200")
        if status.isdigit() and int(status) >= 500:
            placement.failed()
        else:
            placement.first_byte()

    def close(self) -> None:
        if self.placement is not None:
            self.placement.release()
