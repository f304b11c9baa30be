"""Failures seen from outside: dead workers, broken streams, vanished clients, empty fleets."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from harness import free_port, metric, scrape, start_frontend, wait_indexed, wait_until
from harness import in_flight as in_flight_total
from tests.server.conftest import MODEL, make_fleet
from tests.server.test_routing import ask, system_prompt

pytestmark = pytest.mark.slow  # spawns fleets of real processes


def test_worker_killed_before_first_token_is_retried_transparently(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    # A slow health poll, so the router still believes in the dead worker when the request comes.
    f = make_fleet(tmp_path, qwen_tokenizer_dir, n=2, frontend_args=("--worker-poll-interval", "60"))
    try:
        messages = [{"role": "system", "content": system_prompt(7)}, {"role": "user", "content": "hello"}]
        first, _ = ask(f.base_url, messages)
        wait_indexed(f.frontend, f.workers)
        victim = next(w for w in f.workers if httpx.get(w.url + "/infera/worker").json()["instance_id"] == first)
        victim.kill()
        messages.append({"role": "user", "content": "again"})
        second, _ = ask(f.base_url, messages)  # the prefix points at the dead worker
        assert second != first
        assert metric(scrape(f.frontend.url), "infera_request_retries_total") >= 1
        assert in_flight_total(f.frontend.url) == 0
    finally:
        f.stop()


def test_all_workers_dead_is_a_502_not_a_hang(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    f = make_fleet(tmp_path, qwen_tokenizer_dir, n=1, frontend_args=("--worker-poll-interval", "60"))
    try:
        f.workers[0].kill()
        c = openai.OpenAI(base_url=f.base_url, api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError) as exc:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4)
        assert exc.value.status_code == 502
        assert in_flight_total(f.frontend.url) == 0
    finally:
        f.stop()


def test_worker_killed_mid_stream_ends_with_an_error_event(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    f = make_fleet(tmp_path, qwen_tokenizer_dir, n=1, mock_args=("--speedup-ratio", "1"))
    try:
        c = openai.OpenAI(base_url=f.base_url, api_key="unused", max_retries=0, timeout=30)
        stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long story"}],
                                           max_tokens=3000, stream=True)
        got = 0
        started = time.monotonic()
        with pytest.raises(openai.APIError):
            for _ in stream:
                got += 1
                if got == 3:
                    f.workers[0].kill()
        assert got >= 3
        assert time.monotonic() - started < 30
        wait_until(lambda: in_flight_total(f.frontend.url) == 0, 20, "every load ticket released")
    finally:
        f.stop()


def test_client_disconnect_cancels_upstream_and_releases_load(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    f = make_fleet(tmp_path, qwen_tokenizer_dir, n=1, mock_args=("--speedup-ratio", "1"))
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me everything"}],
                "max_tokens": 5000, "stream": True}
        with httpx.Client(timeout=30) as http, http.stream("POST", f.base_url + "/chat/completions",
                                                           json=body) as resp:
            lines = resp.iter_lines()
            for _ in range(3):
                next(lines)
            assert in_flight_total(f.frontend.url) == 1
        engine = f.workers[0].url
        wait_until(lambda: metric(scrape(engine), "vllm:num_requests_running") == 0
                        and metric(scrape(engine), "vllm:num_requests_waiting") == 0, 20, "the engine idle")
        wait_until(lambda: in_flight_total(f.frontend.url) == 0, 20, "every load ticket released")
    finally:
        f.stop()


def test_client_disconnect_while_waiting_non_streaming(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    f = make_fleet(tmp_path, qwen_tokenizer_dir, n=1, mock_args=("--speedup-ratio", "1"))
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "slow"}], "max_tokens": 5000}

        def fire() -> None:
            try:
                httpx.post(f.base_url + "/chat/completions", json=body, timeout=1.0)
            except httpx.TimeoutException:
                pass

        t = threading.Thread(target=fire)
        t.start()
        t.join()
        engine = f.workers[0].url
        wait_until(lambda: metric(scrape(engine), "vllm:num_requests_running") == 0, 20, "the engine idle")
        wait_until(lambda: in_flight_total(f.frontend.url) == 0, 20, "every load ticket released")
    finally:
        f.stop()


def test_no_workers_is_503(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    frontend = start_frontend(tmp_path, [nowhere], tokenizer=qwen_tokenizer_dir, expect_workers=0)
    try:
        health = httpx.get(frontend.url + "/health")
        assert health.status_code == 503 and health.json()["workers"] == 0
        resp = httpx.post(frontend.url + "/v1/chat/completions",
                          json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert resp.status_code == 503
        assert resp.json()["error"]["type"] == "service_unavailable"
    finally:
        frontend.stop()
