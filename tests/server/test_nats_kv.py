"""KV-aware routing fed by KV events over NATS routes the same as when fed over ZMQ."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from harness import NatsServer, Process, index_caught_up, metric, scrape, start_frontend, start_mock, wait_until
from tests.server.conftest import MOCK_ARGS, MODEL

FAMILIES = [f"You are assistant number {i}. " + " ".join(f"rule {i}.{j}: be precise about topic {j}." for j in
                                                         range(40)) for i in range(4)]


def routing_pattern(frontend: Process) -> list[bool]:
    """For each prompt family: does a follow-up sharing its long prefix go where the first request went?"""
    c = openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0)
    firsts: list[str] = []
    for system in FAMILIES:
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=2, messages=[{"role": "system", "content": system},
                                                 {"role": "user", "content": "first"}])
        firsts.append(raw.headers["x-infera-worker"])
    wait_until(lambda: index_caught_up(frontend.url), 10, "the KV events arrived", detail=frontend.output)
    same = []
    for system, first in zip(FAMILIES, firsts, strict=True):
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=2, messages=[{"role": "system", "content": system},
                                                 {"role": "user", "content": "second question"}])
        same.append(raw.headers["x-infera-worker"] == first)
    assert len(set(firsts)) == 2, "distinct prefixes should spread over both workers"
    return same


@pytest.mark.parametrize("transport", ["nats", "zmq"])
def test_kv_aware_routing_fed_by_nats_events_matches_zmq(transport: str, tmp_path: Path,
                                                         qwen_tokenizer_dir: Path) -> None:
    broker = NatsServer(tmp_path / "nats.log")
    broker.start()
    args = ("--request-transport", "nats", "--kv-event-transport", "nats", "--nats-server", broker.url) \
        if transport == "nats" else ()
    workers = [start_mock(tmp_path, model_path=qwen_tokenizer_dir, model=MODEL, args=(*MOCK_ARGS, *args))
               for _ in range(2)]
    try:
        fe = start_frontend(tmp_path, workers, tokenizer=qwen_tokenizer_dir, args=args)
        try:
            assert routing_pattern(fe) == [True] * len(FAMILIES)
            text = scrape(fe.url)
            for w in workers:
                wid = w.url.replace("http://", "mock-").replace(":", "-")
                assert metric(text, "infera_kv_event_batches_total", worker=wid) > 0, text
            assert "KV-event batches lost" not in fe.output()
        finally:
            fe.stop()
    finally:
        for w in workers:
            w.stop()
        broker.stop()
