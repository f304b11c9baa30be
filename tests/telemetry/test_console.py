"""The real process: ``--otel-exporter console`` prints the spans of a request, and ``--log-requests
--log-format json`` its request line with the same trace id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from harness import start_frontend, start_mock, wait_until

MODEL = "mock-model"
ROOT = "POST /v1/chat/completions"


def printed(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The JSON objects in a process's output: the console exporter's spans (indented, several lines
    each) and the one-line log records."""
    spans, lines, decoder, i = [], [], json.JSONDecoder(), 0
    while (i := text.find("{", i)) >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        (spans if "context" in obj else lines).append(obj)
        i = end
    return spans, lines


def test_console_exporter_prints_the_request_spans_and_the_log_line_names_their_trace(tmp_path: Path) -> None:
    engine = start_mock(tmp_path, model=MODEL, args=("--speedup-ratio", "50"))
    frontend = None
    try:
        frontend = start_frontend(tmp_path, [engine], policy="round-robin",
                                  args=("--otel-exporter", "console", "--log-requests", "--log-format", "json"))
        resp = httpx.post(frontend.url + "/v1/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert resp.status_code == 200
        fe = frontend
        wait_until(lambda: ROOT in fe.output(1 << 20) and '"infera.request"' in fe.output(1 << 20), 20,
                   "the root span and the request line printed")
        spans, lines = printed(fe.output(1 << 20))
    finally:
        if frontend is not None:
            frontend.stop()
        engine.stop()
    names = {s["name"] for s in spans}
    assert {ROOT, "intake", "tokenize", "pick", "leg mixed"} <= names
    root = next(s for s in spans if s["name"] == ROOT)
    assert root["kind"] == "SpanKind.SERVER" and root["attributes"]["http.response.status_code"] == 200
    (request,) = [line for line in lines if line.get("logger") == "infera.request"]
    assert "0x" + request["trace_id"] == root["context"]["trace_id"]
    assert request["request_id"] == resp.headers["x-request-id"] and request["status"] == 200
    assert request["workers"] == [resp.headers["x-infera-worker"]]
