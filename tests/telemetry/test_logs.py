"""Logs that join up: the request line (JSON and text), and warnings about a request naming its ids."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from infera.telemetry.logs import JsonFormatter, RequestIds, RequestLog, TextFormatter
from infera.telemetry.record import RequestRecord, bind, unbind
from tests.fakes import MODEL, worker
from tests.telemetry.conftest import FailFirst, Traced, one

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 5}


async def test_the_json_request_line_carries_the_decision_and_the_trace_id_of_the_spans() -> None:
    t = Traced(worker("w1"), worker("w2"))
    async with t.client() as client:
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                     headers={"x-request-id": "abc"})
        whole = await client.post("/v1/chat/completions", json=CHAT)
    first, second = t.lines()
    root = [s for s in t.spans() if s.name == "POST /v1/chat/completions"]
    assert {f"{s.context.trace_id:032x}" for s in root} == {first["trace_id"], second["trace_id"]}
    assert first["request_id"] == "abc" and second["request_id"] == whole.headers["x-request-id"]
    assert first["model"] == MODEL and first["workers"] == [streamed.headers["x-infera-worker"]]
    assert first["policy"] == "round-robin" and first["reason"] and first["overlap_blocks"] == 0
    assert first["status"] == 200 and first["ttft_ms"] > 0 and first["duration_ms"] >= first["ttft_ms"]
    assert first["output_tokens"] == 2 and second["output_tokens"] == 1  # the usage the worker reported
    assert first["prompt_tokens"] > 0 and first["level"] == "info" and first["ts"].endswith("Z")


async def test_a_request_sent_with_two_ids_and_two_parents_is_logged_and_traced_under_the_first() -> None:
    """The id the response carries (RequestIdMiddleware keeps the first) and the parent forwarded to the
    worker (the first) are the request line's and the root span's."""
    t = Traced(worker("w1"))
    first_parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = [("x-request-id", "first-id"), ("traceparent", first_parent), ("x-request-id", "second-id"),
               ("traceparent", "00-11111111111111111111111111111111-2222222222222222-01")]
    async with t.client() as client:
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    (line,) = t.lines()
    assert resp.headers["x-request-id"] == line["request_id"] == "first-id"
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c" == first_parent[3:35]
    root = one(t.spans(), "POST /v1/chat/completions")
    assert root.parent is not None and root.parent.span_id == 0xB7AD6B7169203331


async def test_the_request_line_without_tracing_keeps_a_callers_trace_id() -> None:
    t = Traced(worker("w1"), tracing=False)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with t.client() as client:
        await client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": parent})
        await client.post("/v1/chat/completions", json=CHAT)
    with_parent, without = t.lines()
    assert with_parent["trace_id"] == "0af7651916cd43dd8448eb211c80319c" and without["trace_id"] == ""
    assert t.spans() == () and t.transport.calls[0].headers["traceparent"] == parent  # forwarded as is


async def test_a_warning_about_a_retried_request_names_its_request_and_trace_ids(
        caplog: pytest.LogCaptureFixture) -> None:
    t = Traced(worker("w1"), worker("w2"), transport=FailFirst(text="hello there"))
    caplog.handler.addFilter(RequestIds())
    with caplog.at_level(logging.WARNING, logger="infera.router"):
        async with t.client() as client:
            resp = await client.post("/v1/chat/completions", json=CHAT)
    (line,) = t.lines()
    warnings = [r for r in caplog.records if "failed before its first byte" in r.getMessage()]
    assert len(warnings) == 1 and resp.status_code == 200
    assert warnings[0].__dict__["request_id"] == line["request_id"] == resp.headers["x-request-id"]
    assert warnings[0].__dict__["trace_id"] == line["trace_id"]
    assert f"{one(t.spans(), 'POST /v1/chat/completions').context.trace_id:032x}" == line["trace_id"]
    assert line["failed_workers"] and line["workers"] != line["failed_workers"]


def test_formatters_append_the_ids_only_to_lines_about_a_request() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RequestIds())
    log = logging.getLogger("tests.telemetry.formatters")
    log.propagate = False
    log.addHandler(handler)
    try:
        for formatter in (TextFormatter(), JsonFormatter()):
            handler.setFormatter(formatter)
            log.warning("outside")
            token = bind(RequestRecord("r1", "0af7651916cd43dd8448eb211c80319c"))
            try:
                log.warning("inside %d", 1)
            finally:
                unbind(token)
    finally:
        log.removeHandler(handler)
    text_out, text_in, json_out, json_in = out.getvalue().splitlines()
    assert "request_id" not in text_out and text_in.endswith(
        "inside 1 [request_id=r1 trace_id=0af7651916cd43dd8448eb211c80319c]")
    assert "request_id" not in orjson.loads(json_out)
    assert orjson.loads(json_in) | {"ts": ""} == {"ts": "", "level": "warning", "logger": "tests.telemetry.formatters",
                                                  "msg": "inside 1", "request_id": "r1",
                                                  "trace_id": "0af7651916cd43dd8448eb211c80319c"}


def test_a_traced_records_trace_id_reads_as_32_hex_digits_leading_zeros_kept() -> None:
    """A traced request's record keeps its trace id as the int its spans carry; its lines read the hex."""
    record = RequestRecord("r1", 0xAB)
    assert record.trace_id == "000000000000000000000000000000ab" == record.trace_id
    line = orjson.loads(RequestLog("json", io.BytesIO()).line(RequestRecord("r2", (1 << 128) - 1), "/v1/completions"))
    assert line["trace_id"] == "f" * 32


def test_the_text_request_line_is_key_value_pairs() -> None:
    record = RequestRecord("r1", "")
    record.workers, record.status, record.model = ["w1", "w2"], 200, "m"
    line = RequestLog("text", io.BytesIO()).line(record, "/v1/completions").decode()
    assert " INFO infera.request: request request_id=r1 trace_id=- path=/v1/completions model=m workers=w1,w2 " in line
    assert line.endswith(" status=200\n")


def test_a_queued_request_log_writes_the_same_lines_off_the_request_path() -> None:
    """The servers' log: the request path only queues the record; a thread (or close) writes the lines."""
    record = RequestRecord("req-1", "ab" * 16)
    record.model, record.workers, record.status, record.output_tokens = MODEL, ["w1"], 200, 3
    direct, queued_out = io.BytesIO(), io.BytesIO()
    queued = RequestLog("json", queued_out, queued=True, tick=3600)
    RequestLog("json", direct).write(record, "/v1/completions")
    queued.write(record, "/v1/completions")
    queued.write(record, "/v1/chat/completions")
    assert queued_out.getvalue() == b""  # not yet: the thread writes every tick
    queued.close()
    first, second = (orjson.loads(line) for line in queued_out.getvalue().splitlines())
    expected = orjson.loads(direct.getvalue())
    for line in (first, second, expected):
        del line["ts"], line["duration_ms"]
    assert first == expected and second == {**expected, "path": "/v1/chat/completions"}


def test_the_json_lines_time_is_the_iso_time_of_its_request_in_utc() -> None:
    import io

    from infera.telemetry.logs import RequestLog, _iso
    from infera.telemetry.record import RequestRecord

    log = RequestLog("json", io.BytesIO())
    record = RequestRecord("r1", "")
    for at in (1764000000.123, 1764000000.999, 1764000001.0, 1764000000.5, 1.25):  # the second changes, returns
        assert orjson.loads(log.line(record, "/v1/completions", at=at))["ts"] == _iso(at)
    assert _iso(1764000000.5) == "2025-11-24T16:00:00.500Z"


async def test_a_queued_request_log_writes_its_lines_from_the_event_loop_soon_after_the_request() -> None:
    import asyncio
    import io
    import threading

    from infera.telemetry.logs import RequestLog
    from infera.telemetry.record import RequestRecord

    out = io.BytesIO()
    log = RequestLog("json", out, queued=True, tick=0.01)
    log.write(RequestRecord("r1", ""), "/v1/completions")
    assert out.getvalue() == b""
    for _ in range(500):  # a bounded wait for the loop's timer
        if out.getvalue():
            break
        await asyncio.sleep(0.01)
    assert orjson.loads(out.getvalue())["request_id"] == "r1"
    assert not any(t.name == "infera-request-log" for t in threading.enumerate())  # no thread was needed
    log.close()


def test_a_queued_request_log_without_an_event_loop_writes_from_a_thread_woken_for_it() -> None:
    import io
    import time

    from infera.telemetry.logs import RequestLog
    from infera.telemetry.record import RequestRecord

    out = io.BytesIO()
    log = RequestLog("json", out, queued=True, tick=0.01)
    log.write(RequestRecord("r2", ""), "/v1/completions")
    deadline = time.monotonic() + 5
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert orjson.loads(out.getvalue())["request_id"] == "r2"
    log.close()
