"""Logs that join up with traces: the request line, and the ids on every other line about a request.

The request line (``--log-requests``) is built once per request: orjson for ``--log-format json``,
``key=value`` pairs for ``text``. A queued log (the servers') only notes the finished record on the
request path; the lines are built and written ``tick`` (0.1 s) after the first of a batch, several in
one write, by a timer on the event loop (:class:`~infera.telemetry.later.Later`): measured in a loaded
frontend, building and writing the line in place cost ~60 µs per request, several times its cost in a
loop, and a thread writing them every tick cost more than the lines. Other log lines go through :mod:`logging`;
:class:`RequestIds` adds the current request's ids to them (a warning about a retried request names
the same request and trace ids as its request line and its spans).
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from collections import deque
from typing import IO, Any

import orjson

from infera.telemetry.later import Later
from infera.telemetry.record import RequestRecord, current

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"


def request_fields(record: RequestRecord, path: str, now: float | None = None) -> dict[str, Any]:
    """The request line's fields, in order. Times in milliseconds; ``output_tokens`` -1 when unknown;
    ``now``: when the request ended (``time.perf_counter()``; by default, now)."""
    if now is None:
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
    """Writes one line per finished request to ``stream`` (a binary stream; stderr's by default): at
    once, or ``queued``: ``tick`` seconds after the first queued line, at ``batch`` lines, and at
    :meth:`close` (which runs at exit)."""

    def __init__(self, fmt: str = "text", stream: IO[bytes] | None = None, logger: str = "infera.request",
                 queued: bool = False, tick: float = 0.1, batch: int = 64) -> None:
        if fmt not in ("text", "json"):
            raise ValueError(f"unknown log format {fmt!r} (text or json)")
        self._json = fmt == "json"
        self._stream = stream if stream is not None else sys.stderr.buffer
        self._logger = logger
        self._queue: deque[tuple[RequestRecord, str, float, float]] | None = None
        self._batch = batch
        self._lock = threading.Lock()
        self._tick = tick
        self._second, self._prefix = -1, ""  # the last line's whole second (epoch), and its ISO form
        self._later = Later(self._flush_queued, "infera-request-log")
        if queued:
            self._queue = deque()
            atexit.register(self.close)

    def line(self, record: RequestRecord, path: str, ended: float | None = None, at: float | None = None) -> bytes:
        """The line of a request that ended at ``ended`` (``time.perf_counter()``) and wall time ``at``."""
        fields = request_fields(record, path, ended)
        now = time.time() if at is None else at
        if self._json:
            whole = int(now)
            if whole != self._second:  # the lines of a batch mostly share their second: format it once
                self._second, self._prefix = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            ts = f"{self._prefix}.{int(now % 1 * 1000):03d}Z"
            return orjson.dumps({"ts": ts, "level": "info", "logger": self._logger, "msg": "request",
                                 **fields}) + b"\n"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
        pairs = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        return f"{stamp} INFO {self._logger}: request {pairs}\n".encode()

    def write(self, record: RequestRecord, path: str) -> None:
        """The line of a request that has just ended (the record is not changed after this)."""
        queue = self._queue
        if queue is not None:
            queue.append((record, path, time.perf_counter(), time.time()))
            if len(queue) >= self._batch:  # busy: write here, in one go
                self.flush()
            else:
                self._later.soon(self._tick)
            return
        stream = self._stream
        stream.write(self.line(record, path))
        stream.flush()

    def flush(self) -> None:
        """Write the queued lines."""
        queue = self._queue
        if not queue:
            return
        lines = []
        with self._lock:  # lines in order, whichever thread flushes
            while True:
                try:
                    record, path, ended, at = queue.popleft()
                except IndexError:
                    break
                lines.append(self.line(record, path, ended, at))
            if lines:
                self._stream.write(b"".join(lines))
                self._stream.flush()

    def _flush_queued(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # a closed or broken stream: the next lines try again
            logging.getLogger(__name__).warning("could not write request lines: %s", exc)

    def close(self) -> None:
        """Write what is queued and stop the helper thread (if one was started)."""
        self._later.stop()
        self.flush()


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
