"""The frontend through the official openai SDK, against real mock-engine processes."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import metric, scrape
from tests.server.conftest import MODEL, Fleet


def client(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.base_url, api_key="unused", max_retries=0, timeout=60)


def test_chat_non_streaming(fleet: Fleet) -> None:
    reply = client(fleet).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=12)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    assert reply.choices[0].finish_reason == "length"


def test_chat_streaming_with_usage(fleet: Fleet) -> None:
    stream = client(fleet).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Stream please."}], max_tokens=10, stream=True,
        stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text and finish == "length"
    assert usage is not None and usage.completion_tokens == 10


def test_completions_streaming_and_not(fleet: Fleet) -> None:
    c = client(fleet)
    reply = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8)
    assert reply.choices[0].text and reply.usage is not None and reply.usage.completion_tokens == 8
    pieces = [ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt="Once", max_tokens=8,
                                                                  stream=True) if ch.choices]
    assert "".join(pieces)


def test_models_lists_the_fleets_model(fleet: Fleet) -> None:
    assert [m.id for m in client(fleet).models.list().data] == [MODEL]


def test_health_and_workers(fleet: Fleet) -> None:
    health = httpx.get(fleet.frontend.url + "/health").json()
    assert health["workers"] == 3 and health["status"] == "ok"
    workers = httpx.get(fleet.base_url + "/workers").json()["data"]
    assert {w["http_url"] for w in workers} == {w.url for w in fleet.workers}
    assert all(w["kv_events"]["endpoint"].startswith("tcp://") for w in workers)


def test_cache_view_known_and_unknown(fleet: Fleet) -> None:
    wid = httpx.get(fleet.base_url + "/workers").json()["data"][0]["instance_id"]
    view = httpx.get(f"{fleet.base_url}/admin/cache-view/{wid}")
    assert view.status_code == 200 and view.json()["worker_id"] == wid
    missing = httpx.get(f"{fleet.base_url}/admin/cache-view/nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"model": "Qwen/Qwen3-0.6B"}', 400, "messages"),
        (b'{"model": "Qwen/Qwen3-0.6B", "messages": []}', 400, "messages"),
        (b'{"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "x"}], "temperature": 9}',
         400, "temperature"),
        (b'{"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
         400, "max_tokens"),
        (b'{"model": "gpt-unknown", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ],
)
def test_bad_input_gets_openai_errors(fleet: Fleet, body: bytes, status: int, param: str | None) -> None:
    resp = httpx.post(fleet.base_url + "/chat/completions", content=body,
                      headers={"content-type": "application/json"})
    assert resp.status_code == status
    err = resp.json()["error"]
    assert err["message"] and err["type"] in ("invalid_request_error", "not_found_error")
    if param:
        assert err["param"] == param


def test_body_over_the_limit_is_413_and_the_server_keeps_serving(fleet: Fleet) -> None:
    huge = b'{"model": "x", "prompt": "' + b"a" * (9 * 1024 * 1024) + b'"}'
    resp = httpx.post(fleet.base_url + "/completions", content=huge, headers={"content-type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"]["type"] == "invalid_request_error"
    test_chat_non_streaming(fleet)


def test_sdk_raises_the_right_exceptions(fleet: Fleet) -> None:
    c = client(fleet)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=[])


def test_engine_errors_pass_through(fleet: Fleet) -> None:
    too_long = "word " * 40000
    with pytest.raises(openai.BadRequestError) as exc:
        client(fleet).completions.create(model=MODEL, prompt=too_long, max_tokens=4)
    assert exc.value.status_code == 400


def test_metrics_parse_and_count(fleet: Fleet) -> None:
    test_chat_non_streaming(fleet)
    text = scrape(fleet.frontend.url)
    names = {f.name for f in text_string_to_metric_families(text)}
    for name in ("infera_requests", "infera_time_to_first_token_seconds", "infera_request_duration_seconds",
                 "infera_worker_in_flight", "infera_fleet_workers", "infera_kv_event_batches",
                 "infera_kv_indexed_blocks", "infera_routing_decisions", "infera_routed_prompt_overlap_fraction",
                 "infera_inter_token_latency_seconds", "infera_kv_event_gaps"):
        assert name in names, name
    assert metric(text, "infera_requests_total", endpoint="/v1/chat/completions", status="200") >= 1
    assert metric(text, "infera_fleet_workers", role="mixed") == 3
    assert metric(text, "infera_time_to_first_token_seconds_count", endpoint="/v1/chat/completions") >= 1
    decisions = sum(s.value for f in text_string_to_metric_families(text) if f.name == "infera_routing_decisions"
                    for s in f.samples if s.labels.get("policy") == "kv-aware")
    assert decisions >= 1
