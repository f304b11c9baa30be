"""Logs that join up with traces: the request line, and the ids on every other line about a request.

The request line (``--log-requests``) is built once per request and written with one call: orjson
for ``--log-format json``, ``key=value`` pairs for ``text``. Other log lines go through :mod:`logging`;
:class:`RequestIds` adds the current request's ids to them (a warning about a retried request names
the same request and trace ids as its request line and its spans).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any

import orjson

from infera.telemetry.record import RequestRecord, current

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"


def request_fields(record: RequestRecord, path: str) -> dict[str, Any]:
    """The request line's fields, in order. Times in milliseconds; ``output_tokens`` -1 when unknown."""
    now = time.perf_counter()
    fields: dict[str, Any] = {
        "request_id": record.request_id, "trace_id": record.trace_id, "path": path, "model": record.model,
        "workers": record.workers, "policy": record.policy, "reason": record.reason,
        "overlap_blocks": record.overlap_blocks, "prompt_tokens": record.prompt_tokens,
        "ttft_ms": round((record.first_byte - record.started) * 1000.0, 3) if record.first_byte else None,
        "duration_ms": round((now - record.started) * 1000.0, 3), "output_tokens": record.output_tokens,
        "status": record.status}
    if record.failed:
        fields["failed_workers"] = record.failed
    if record.error:
        fields["error"] = record.error
    return fields


class RequestLog:
    """Writes one line per finished request to ``stream`` (a binary stream; stderr's by default)."""

    def __init__(self, fmt: str = "text", stream: IO[bytes] | None = None, logger: str = "infera.request") -> None:
        if fmt not in ("text", "json"):
            raise ValueError(f"unknown log format {fmt!r} (text or json)")
        self._json = fmt == "json"
        self._stream = stream if stream is not None else sys.stderr.buffer
        self._logger = logger

    def line(self, record: RequestRecord, path: str) -> bytes:
        fields = request_fields(record, path)
        now = time.time()
        if self._json:
            return orjson.dumps({"ts": _iso(now), "level": "info", "logger": self._logger, "msg": "request",
                                 **fields}) + b"\n"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
        pairs = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        return f"{stamp} INFO {self._logger}: request {pairs}\n".encode()

    def write(self, record: RequestRecord, path: str) -> None:
        stream = self._stream
        stream.write(self.line(record, path))
        stream.flush()


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    if value is None or value == "":
        return "-"
    return str(value)


class RequestIds(logging.Filter):
    """Adds ``request_id`` and ``trace_id`` of the current request (or "") to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        rec = current()
        record.request_id = rec.request_id if rec is not None else ""
        record.trace_id = rec.trace_id if rec is not None else ""
        return True


class TextFormatter(logging.Formatter):
    """The usual text line, with ``[request_id=... trace_id=...]`` appended for a line about a request."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", "")
        if rid:
            line += f" [request_id={rid} trace_id={getattr(record, 'trace_id', '') or '-'}]"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and the request's ids when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": _iso(record.created), "level": record.levelname.lower(), "logger": record.name,
                               "msg": record.getMessage()}
        rid = getattr(record, "request_id", "")
        if rid:
            out["request_id"] = rid
            out["trace_id"] = getattr(record, "trace_id", "")
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()
