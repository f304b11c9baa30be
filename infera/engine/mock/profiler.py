"""The mock engine's profiler: vLLM's and SGLang's ``/start_profile`` and ``/stop_profile``.

Instead of torch kernels it records a window of scheduler steps: for each step its start
(event-loop clock), modelled duration, rows, prefill tokens, decode rows, KV usage and
preemptions. ``POST /start_profile`` opens the window (optional JSON body, SGLang's names:
``output_dir``, ``num_steps`` to stop by itself after that many steps); ``POST /stop_profile``
closes it and writes ``<dir>/<worker>-<unix ms>.trace.json``, a Chrome trace (open it in
https://ui.perfetto.dev). Both answer JSON; starting twice or stopping an idle profiler is a
400, as SGLang answers.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from infera.engine.mock.responses import json_response
from infera.engine.mock.service import ApiError


class StepProfiler:
    def __init__(self, out_dir: str, name: str) -> None:
        self.out_dir = out_dir or tempfile.gettempdir()
        self.name = name
        self.active = False
        self.last_path: str | None = None
        self.window_dir = self.out_dir
        self._limit: int | None = None
        self._steps: list[dict[str, Any]] = []
        self._t0 = 0.0

    def start(self, output_dir: str | None = None, num_steps: int | None = None) -> None:
        if self.active:
            raise ApiError("profiling is already in progress; stop it first")
        if num_steps is not None and num_steps <= 0:
            raise ApiError("num_steps must be positive", param="num_steps")
        self.window_dir = output_dir or self.out_dir
        self._limit = num_steps
        self._steps = []
        self._t0 = time.monotonic()
        self.active = True

    def record(self, step: int, started: float, seconds: float, rows: int, prefill_tokens: int, decode_rows: int,
               kv_usage: float, preempted: int) -> None:
        """One scheduler step; ``started`` on the monotonic clock, ``seconds`` its modelled duration."""
        self._steps.append({
            "name": "prefill" if prefill_tokens else "decode", "ph": "X", "pid": 0, "tid": 0,
            "ts": round((started - self._t0) * 1e6, 1), "dur": round(seconds * 1e6, 1),
            "args": {"step": step, "rows": rows, "prefill_tokens": prefill_tokens, "decode_rows": decode_rows,
                     "kv_usage": round(kv_usage, 4), "preempted": preempted},
        })
        if self._limit is not None and len(self._steps) >= self._limit:
            self.stop()

    def stop(self) -> dict[str, Any]:
        """Close the window and write it; returns where and how many steps."""
        if not self.active:
            raise ApiError("profiling is not in progress")
        self.active = False
        os.makedirs(self.window_dir, exist_ok=True)
        path = Path(self.window_dir) / f"{self.name}-{int(time.time() * 1000)}.trace.json"
        doc = {"traceEvents": self._steps, "displayTimeUnit": "ms",
               "otherData": {"engine": "infera.mock", "worker": self.name}}
        path.write_text(json.dumps(doc), encoding="utf-8")
        self.last_path = str(path)
        result = {"path": str(path), "steps": len(self._steps)}
        self._steps = []
        return result


class ProfileEndpoints:
    def __init__(self, profiler: StepProfiler) -> None:
        self.profiler = profiler

    async def start(self, request: Request) -> Response:
        body = await _optional_json(request)
        output_dir = body.get("output_dir")
        num_steps = body.get("num_steps")
        if output_dir is not None and not isinstance(output_dir, str):
            raise ApiError("output_dir must be a string", param="output_dir")
        if num_steps is not None and (not isinstance(num_steps, int) or isinstance(num_steps, bool)):
            raise ApiError("num_steps must be an integer", param="num_steps")
        self.profiler.start(output_dir, num_steps)
        return json_response({"status": "started", "output_dir": self.profiler.window_dir, "num_steps": num_steps})

    async def stop(self, request: Request) -> Response:
        return json_response({"status": "stopped", **self.profiler.stop()})


async def _optional_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body
