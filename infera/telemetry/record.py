"""The request record: what one request's telemetry knows, and the spans under its root.

Hooks in the router call the record's methods; with tracing off (or the request not sampled) the
record has no tracing and the methods only fill plain fields for the log line. Child spans whose work
is synchronous (intake, tokenize, pick) are made after the fact with their start time, so the hot path
holds no span object while it runs, and their attributes are built only when the request is traced.
Children are closed as they finish and handed to the processor together with the root when the
request ends (one call, which the OTLP processor encodes in one go); a leg still open then (a stream
the client still reads) is handed over on its own when it ends.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

from opentelemetry.trace import SpanKind

from infera.telemetry.spans import Shape, Span, Stage, Tracing

_CURRENT: ContextVar[RequestRecord | None] = ContextVar("infera_request", default=None)

clock_ns = time.time_ns  # span times are epoch nanoseconds
_LEG_NAMES = {role: f"leg {role}" for role in ("mixed", "prefill", "decode")}
_INTAKE = Shape(("infera.body_bytes",))
_INTAKE_REFUSED = Shape(("infera.body_bytes", "infera.error", "http.response.status_code"))
_TOKENIZE = Shape(("infera.prompt_tokens", "infera.tokenized"))
_PICK = Shape(("infera.role", "infera.policy", "infera.worker", "infera.reason", "infera.overlap_blocks",
               "infera.cost", "infera.candidates"), strings=4)


def current() -> RequestRecord | None:
    """The record of the request this task serves, or None (telemetry off, or not a request)."""
    return _CURRENT.get()


def bind(record: RequestRecord | None) -> Any:
    """Make ``record`` current for this task and the tasks it starts; returns the token for :func:`unbind`."""
    return _CURRENT.set(record)


def unbind(token: Any) -> None:
    _CURRENT.reset(token)


class RequestRecord:
    """One request's ids, routing decision and outcome; ``tracing`` and ``root`` are None unless its
    trace is recorded.

    Times: ``started`` and ``first_byte`` are ``time.perf_counter()`` seconds; ``first_byte`` is when the
    answering worker's first byte came in (0.0 until then).
    """

    __slots__ = ("_trace_id", "children", "done", "error", "failed", "first_byte", "model", "output_tokens",
                 "overlap_blocks", "policy", "prompt_tokens", "reason", "request_id", "retries", "root", "started",
                 "status", "tracing", "workers")

    def __init__(self, request_id: str, trace_id: str | int, tracing: Tracing | None = None, root: Span | None = None,
                 ) -> None:
        self.request_id = request_id
        self._trace_id = trace_id  # as given: an int is written out when read (most requests' never are)
        self.tracing = tracing if root is not None else None
        self.root = root
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
        self.children: list[Span | Stage] = []  # the root's, in start order; handed over when the root ends
        self.done = False  # the root has ended

    @property
    def trace_id(self) -> str:
        """32 hex digits, or "" when neither tracing nor the client gave one."""
        trace_id = self._trace_id
        if type(trace_id) is int:
            trace_id = self._trace_id = f"{trace_id:032x}"
        return trace_id  # type: ignore[return-value]

    # ---- spans made after the fact --------------------------------------------------------------

    def intake(self, start_ns: int, body_bytes: int, error: str = "", status: int = 0) -> None:
        """The ``intake`` span: the body read, parsed and validated (or refused with ``status``)."""
        tracing = self.tracing
        if tracing is not None and self.root is not None:
            self.children.append(("intake", start_ns, clock_ns(), _INTAKE_REFUSED, (body_bytes, error, status))
                                 if error else ("intake", start_ns, clock_ns(), _INTAKE, (body_bytes,)))

    def tokenized(self, start_ns: int, prompt_tokens: int, tokenized: bool) -> None:
        """The ``tokenize`` span: the prompt rendered, tokenized and measured."""
        self.prompt_tokens = prompt_tokens
        tracing = self.tracing
        if tracing is not None and self.root is not None:
            self.children.append(("tokenize", start_ns, clock_ns(), _TOKENIZE, (prompt_tokens, tokenized)))

    def picked(self, role: str, policy: str, worker: str, reason: str, overlap: int, cost: float, candidates: int,
               start_ns: int) -> None:
        """A pick by ``policy`` among ``candidates`` workers for ``role``; the one that computes the prompt
        (mixed or prefill) gives the request's decision for the log line."""
        if role != "decode" or not self.policy:
            self.policy, self.reason, self.overlap_blocks = policy, reason, overlap
        tracing = self.tracing
        if tracing is not None and self.root is not None:
            self.children.append(("pick", start_ns, clock_ns(), _PICK,
                                  (role, policy, worker, reason, overlap, cost, candidates)))

    # ---- legs -------------------------------------------------------------------------------------

    def leg(self, role: str, worker: str) -> Span | None:
        """The span of one transport call (a leg), or None when not traced; end it with the methods below."""
        tracing = self.tracing
        if tracing is None or self.root is None:
            return None
        span = tracing.start(_LEG_NAMES.get(role) or f"leg {role}", self.root, SpanKind.CLIENT,
                             {"infera.role": role, "infera.worker": worker})
        self.children.append(span)
        return span

    def leg_first_byte(self, span: Span | None, worker: str) -> None:
        """The worker's first byte is in: TTFT counts to the last leg's (a pair's decode worker)."""
        self.workers.append(worker)
        self.first_byte = time.perf_counter()
        if span is not None:
            span.event("first_byte")

    def leg_failed(self, span: Span | None, worker: str, error: BaseException) -> None:
        self.failed.append(worker)
        if span is not None:
            span.error(str(error) or type(error).__name__)
            self.leg_done(span)

    def leg_done(self, span: Span | None) -> None:
        """The leg's response has ended (idempotent)."""
        if span is None or span.end:
            return
        span.close()
        if self.done and self.tracing is not None:  # the request ended first: this leg goes out alone
            self.tracing.end(span)

    @staticmethod
    def traceparent(span: Span) -> str:
        """W3C ``traceparent`` naming ``span`` (recorded, so sampled) as the parent, for the request sent on
        to a worker."""
        return f"00-{span.trace_id:032x}-{span.span_id:016x}-01"

    # ---- the root ---------------------------------------------------------------------------------

    def finish(self) -> None:
        """End the root span with the outcome and hand it over with its closed children (idempotent)."""
        root, tracing = self.root, self.tracing
        if root is None or tracing is None or self.done:
            return
        self.done = True
        attributes = root.attributes
        attributes["http.response.status_code"] = self.status
        if self.model:
            attributes["infera.model"] = self.model
        if self.workers:
            attributes["infera.workers"] = list(self.workers)
        if self.first_byte:
            attributes["infera.ttft_ms"] = round((self.first_byte - self.started) * 1000.0, 3)
        if self.output_tokens >= 0:
            attributes["infera.output_tokens"] = self.output_tokens
        if self.status >= 500 or self.error:
            root.error(self.error or f"status {self.status}")
        root.close()
        tracing.emit(root, [c for c in self.children if type(c) is tuple or c.end])  # type: ignore[union-attr]
