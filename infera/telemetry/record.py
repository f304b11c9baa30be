"""The request record: what one request's telemetry knows, and the spans under its root.

Hooks in the router call the record's methods; with tracing off (or the request not sampled) the
record has no tracer and the methods only fill plain fields for the log line. Child spans whose work
is synchronous (intake, tokenize, pick) are made after the fact with their start time, so the hot path
holds no span object while it runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

_CURRENT: ContextVar[RequestRecord | None] = ContextVar("infera_request", default=None)

clock_ns = time.time_ns  # span times are epoch nanoseconds


def current() -> RequestRecord | None:
    """The record of the request this task serves, or None (telemetry off, or not a request)."""
    return _CURRENT.get()


def bind(record: RequestRecord | None) -> Any:
    """Make ``record`` current for this task and the tasks it starts; returns the token for :func:`unbind`."""
    return _CURRENT.set(record)


def unbind(token: Any) -> None:
    _CURRENT.reset(token)


class RequestRecord:
    """One request's ids, routing decision and outcome; ``tracer`` is None unless its trace is recorded.

    Times: ``started`` and ``first_byte`` are ``time.perf_counter()`` seconds; ``first_byte`` is when the
    answering worker's first byte came in (0.0 until then).
    """

    __slots__ = ("context", "error", "failed", "first_byte", "model", "output_tokens", "overlap_blocks", "policy",
                 "prompt_tokens", "reason", "request_id", "retries", "root", "started", "status", "trace_id",
                 "tracer", "workers")

    def __init__(self, request_id: str, trace_id: str, tracer: Tracer | None = None, root: Span | None = None,
                 context: Context | None = None) -> None:
        self.request_id = request_id
        self.trace_id = trace_id  # 32 hex digits, or "" when neither tracing nor the client gave one
        self.tracer = tracer
        self.root = root
        self.context = context  # the root span's context: every child's parent
        self.started = time.perf_counter()
        self.first_byte = 0.0
        self.model = ""
        self.policy = ""
        self.reason = ""
        self.overlap_blocks = 0
        self.prompt_tokens = 0
        self.output_tokens = -1  # -1: unknown
        self.workers: list[str] = []  # the workers that answered, in leg order ("prefill", then "decode")
        self.failed: list[str] = []  # workers that failed before their first byte (then retried elsewhere)
        self.retries = 0
        self.status = 0
        self.error = ""

    # ---- spans made after the fact --------------------------------------------------------------

    def stage(self, name: str, start_ns: int, attributes: Mapping[str, Any] | None = None) -> None:
        """A child span of the root from ``start_ns`` to now (intake, tokenize)."""
        tracer = self.tracer
        if tracer is not None:
            tracer.start_span(name, self.context, attributes=attributes, start_time=start_ns).end()

    def picked(self, role: str, policy: str, worker: str, reason: str, overlap: int, cost: float, candidates: int,
               start_ns: int) -> None:
        """A pick by ``policy`` among ``candidates`` workers for ``role``; the one that computes the prompt
        (mixed or prefill) gives the request's decision for the log line."""
        if role != "decode" or not self.policy:
            self.policy, self.reason, self.overlap_blocks = policy, reason, overlap
        tracer = self.tracer
        if tracer is not None:
            tracer.start_span("pick", self.context, start_time=start_ns, attributes={
                "infera.role": role, "infera.policy": policy, "infera.worker": worker, "infera.reason": reason,
                "infera.overlap_blocks": overlap, "infera.cost": cost, "infera.candidates": candidates}).end()

    # ---- legs -------------------------------------------------------------------------------------

    def leg(self, role: str, worker: str) -> Span | None:
        """The span of one transport call (a leg), or None when not traced; end it with the methods below."""
        tracer = self.tracer
        if tracer is None:
            return None
        return tracer.start_span(f"leg {role}", self.context, kind=SpanKind.CLIENT,
                                 attributes={"infera.role": role, "infera.worker": worker})

    def leg_first_byte(self, span: Span | None, worker: str) -> None:
        """The worker's first byte is in: TTFT counts to the last leg's (a pair's decode worker)."""
        self.workers.append(worker)
        self.first_byte = time.perf_counter()
        if span is not None:
            span.add_event("first_byte")

    def leg_failed(self, span: Span | None, worker: str, error: BaseException) -> None:
        self.failed.append(worker)
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, str(error)))
            span.end()

    def leg_done(self, span: Span | None) -> None:
        if span is not None:
            span.end()

    # ---- the root ---------------------------------------------------------------------------------

    @staticmethod
    def traceparent(span: Span) -> str:
        """W3C ``traceparent`` naming ``span`` as the parent, for the request sent on to a worker."""
        ctx = span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def finish(self) -> None:
        """End the root span with the outcome (idempotent through the SDK)."""
        root = self.root
        if root is None or not root.is_recording():
            return
        root.set_attribute("http.response.status_code", self.status)
        if self.model:
            root.set_attribute("infera.model", self.model)
        if self.workers:
            root.set_attribute("infera.workers", self.workers)
        if self.first_byte:
            root.set_attribute("infera.ttft_ms", round((self.first_byte - self.started) * 1000.0, 3))
        if self.output_tokens >= 0:
            root.set_attribute("infera.output_tokens", self.output_tokens)
        if self.status >= 500 or self.error:
            root.set_status(Status(StatusCode.ERROR, self.error or f"status {self.status}"))
        root.end()
