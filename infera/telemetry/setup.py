"""Building telemetry from settings: the tracer provider for ``--otel-exporter`` and the log handlers
for ``--log-format``.

The OpenTelemetry SDK reads its standard environment itself: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) for the OTLP exporter, ``OTEL_TRACES_SAMPLER`` and
``OTEL_TRACES_SAMPLER_ARG`` for sampling, ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` for
the resource.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import IO

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from infera.telemetry.logs import JsonFormatter, RequestIds, RequestLog, TextFormatter
from infera.telemetry.otlp import otlp_exporter, otlp_processor
from infera.telemetry.spans import Tracing
from infera.telemetry.tracing import Telemetry

EXPORTERS = ("none", "otlp", "console")
LOG_FORMATS = ("text", "json")


def exporter_for(name: str, out: IO[str] | None = None) -> SpanExporter | None:
    """The span exporter ``--otel-exporter`` names (None for ``none``); raises ValueError if unusable."""
    if name == "none":
        return None
    if name == "console":
        return ConsoleSpanExporter(out=out or sys.stdout)
    if name == "otlp":
        try:
            return otlp_exporter()
        except ImportError as exc:
            raise ValueError("--otel-exporter otlp needs the OTLP exporter: pip install 'infera[otlp]' "
                             "(opentelemetry-exporter-otlp-proto-http)") from exc
    raise ValueError(f"unknown --otel-exporter {name!r} (one of {', '.join(EXPORTERS)})")


def tracing_for(exporter: str, service_name: str) -> Tracing | None:
    """Tracing that exports as ``exporter`` says (None for ``none``): in batches from a background thread,
    or each span as it ends for ``console``. The SDK's provider parses the sampler and the resource from
    the standard environment, and flushes the processor at process exit."""
    span_exporter = exporter_for(exporter)
    if span_exporter is None:
        return None
    # OTEL_SERVICE_NAME, when set, names the service rather than the process kind's default
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    processor: SpanProcessor | None = SimpleSpanProcessor(span_exporter) if exporter == "console" else None
    if exporter == "otlp":  # spans encoded as they end: nothing of a request outlives it (otlp.py)
        processor = otlp_processor(span_exporter)
    if processor is None:
        processor = BatchSpanProcessor(span_exporter)
    provider.add_span_processor(processor)
    return Tracing(processor, provider.sampler, provider.resource)


def build_telemetry(exporter: str, log_requests: bool, log_format: str, service_name: str) -> Telemetry:
    """Telemetry for a process, from its ``--otel-exporter``, ``--log-requests`` and ``--log-format``."""
    return Telemetry(tracing_for(exporter, service_name), RequestLog(log_format, queued=True) if log_requests else None)


def configure_logging(level: str, log_format: str) -> None:
    """The root logger's one handler on stderr, in ``log_format``, adding request ids to each line."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown --log-format {log_format!r} (text or json)")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestIds())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
