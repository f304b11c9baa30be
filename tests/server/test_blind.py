"""When KV events are missing or stop, the router says so and predicts caches from its own decisions."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from harness import free_port, metric, scrape, start_frontend, start_mock, wait_until
from tests.server.conftest import MODEL
from tests.server.test_routing import ask, system_prompt

pytestmark = pytest.mark.slow  # spawns fleets of real processes


def test_workers_without_events_still_get_prefix_affinity(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    workers = [start_mock(tmp_path, model_path=qwen_tokenizer_dir, model=MODEL,
                          args=("--no-kv-events", "--speedup-ratio", "50")) for _ in range(3)]
    frontend = start_frontend(tmp_path, workers, tokenizer=qwen_tokenizer_dir)
    try:
        chats = [[{"role": "system", "content": system_prompt(300 + i)}] for i in range(3)]
        served: dict[int, set[str]] = {i: set() for i in range(3)}
        for turn in range(3):
            for i, messages in enumerate(chats):
                messages.append({"role": "user", "content": f"turn {turn}"})
                worker, hit = ask(frontend.url + "/v1", messages)
                served[i].add(worker)
                if turn:
                    assert hit > 200, "the predicted holder really had the prefix"
        assert all(len(s) == 1 for s in served.values()), served
        text = scrape(frontend.url)
        for w in httpx.get(frontend.url + "/v1/workers").json()["data"]:
            assert metric(text, "infera_kv_events_stale", worker=w["instance_id"]) == 1
    finally:
        frontend.stop()
        for w in workers:
            w.stop()


def test_silent_event_stream_is_detected(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    engine = start_mock(tmp_path, model_path=qwen_tokenizer_dir, model=MODEL, args=("--speedup-ratio", "50"))
    # The record points at an event endpoint where nobody publishes: the router hears nothing.
    silent = f"tcp://127.0.0.1:{free_port()}"
    fleet_file = tmp_path / "fleet.json"
    fleet_file.write_text(json.dumps([{"http_url": engine.url, "model": MODEL, "instance_id": "quiet",
                                       "kv_block_size": 16, "kv_events": {"endpoint": silent}}]))
    frontend = start_frontend(tmp_path, [], tokenizer=qwen_tokenizer_dir, expect_workers=1,
                              args=("--workers-file", str(fleet_file), "--kv-events-stale-seconds", "0.5"))
    try:
        assert metric(scrape(frontend.url), "infera_kv_events_stale", worker="quiet") == 0
        ask(frontend.url + "/v1", [{"role": "system", "content": system_prompt(1)},
                                   {"role": "user", "content": "hi"}])
        wait_until(lambda: metric(scrape(frontend.url), "infera_kv_events_stale", worker="quiet") == 1, 10,
                   "the silent worker reported stale")
        # the flag is a pure query; the warning comes from the feed's next tick
        wait_until(lambda: "no KV events" in frontend.output(), 10, "the blindness warning in the log")
    finally:
        frontend.stop()
        engine.stop()
