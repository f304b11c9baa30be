"""Requests and KV events over a real NATS server: mock engines behind their NATS bridge, real frontends.

Workers are found by static discovery (the record from ``GET /infera/worker``); its
``nats_subject`` tells the frontend that the worker takes requests over NATS.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from harness import NatsServer, Process, get_json, metric, scrape, start_frontend, start_mock, wait_until

MODEL = "mock-model"
FAST = ("--speedup-ratio", "50")
SLOW = ("--speedup-ratio", "0.05")  # prefill ~0.3 s, then ~0.12 s per token
MSG = [{"role": "user", "content": "Tell me about routers."}]


def nats_args(server: NatsServer) -> tuple[str, ...]:
    return ("--request-transport", "nats", "--kv-event-transport", "nats", "--nats-server", server.url)


def client(frontend: Process) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.url + "/v1", api_key="x", max_retries=0, timeout=30)


def running(worker: Process) -> float:
    return metric(scrape(worker.url), "vllm:num_requests_running")


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nats-fleet")


@pytest.fixture(scope="module")
def slow_workers(tmp: Path, broker: NatsServer) -> Iterator[list[Process]]:
    workers = [start_mock(tmp, model=MODEL, args=(*SLOW, *nats_args(broker))) for _ in range(2)]
    yield workers
    for w in workers:
        w.stop()


@pytest.fixture
def frontends(tmp: Path) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(workers: list[Process | str], *args: str, expect: int | None = None, policy: str = "round-robin",
              tokenizer: Path | str = "") -> Process:
        fe = start_frontend(tmp, workers, policy=policy, tokenizer=tokenizer, args=args, expect_workers=expect)
        started.append(fe)
        return fe

    yield start
    for fe in started:
        fe.stop()


def test_streaming_and_not_over_nats_through_the_openai_sdk(tmp: Path, broker: NatsServer,
                                                            frontends: Callable[..., Process]) -> None:
    worker = start_mock(tmp, model=MODEL, args=(*FAST, *nats_args(broker)))
    try:
        assert get_json(worker.url + "/infera/worker")["nats_subject"].startswith("infera.req.")
        fe = frontends([worker], *nats_args(broker))
        c = client(fe)
        resp = c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=12)
        assert resp.choices[0].message.content and resp.usage is not None and resp.usage.completion_tokens == 12
        chunks = list(c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=12, stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == resp.choices[0].message.content  # the mock's output is deterministic per prompt
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
        done = c.completions.create(model=MODEL, prompt="hello there", max_tokens=5)
        assert done.choices[0].text
        with pytest.raises(openai.BadRequestError):  # an engine's 4xx comes back as is
            c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=-1)
    finally:
        worker.stop()


def test_429_at_max_pending(slow_workers: list[Process], broker: NatsServer, frontends: Callable[..., Process]) -> None:
    fe = frontends(slow_workers, *nats_args(broker), "--nats-req-max-pending", "1")
    c = client(fe)
    results: list[object] = []

    def slow() -> None:
        try:
            results.append(c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=15))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=slow) for _ in range(2)]
    for held, t in enumerate(threads, 1):
        t.start()
        wait_until(lambda held=held: sum(running(w) for w in slow_workers) == held, 10,
                   f"{held} request(s) running in the engines")
    with pytest.raises(openai.RateLimitError) as exc:  # both workers hold one request: 429 after the retry
        c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2)
    assert "max-pending" in str(exc.value)
    for t in threads:
        t.join(30)
    assert len(results) == 2 and not any(isinstance(r, Exception) for r in results), results
    c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2)  # admitted again once they ended


@pytest.mark.parametrize("flag", ["--nats-req-idle-timeout", "--nats-req-max-duration"])
def test_504_on_timeout_then_the_engine_is_told_to_cancel(flag: str, slow_workers: list[Process], broker: NatsServer,
                                                          frontends: Callable[..., Process]) -> None:
    worker = slow_workers[0]
    fe = frontends([worker], *nats_args(broker), flag, "0.8", "--request-max-retries", "0")
    c = client(fe)
    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as exc:  # non-streaming: the answer would come after ~6 s
        c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=50)
    assert exc.value.status_code == 504
    assert 0.7 < time.monotonic() - start < 3
    wait_until(lambda: running(worker) == 0, 2.0, "cancelled in the engine")


def test_idle_timeout_mid_stream_ends_the_stream_and_cancels(slow_workers: list[Process], broker: NatsServer,
                                                            frontends: Callable[..., Process]) -> None:
    worker = slow_workers[0]
    fe = frontends([worker], *nats_args(broker), "--nats-req-max-duration", "1.5", "--request-max-retries", "0")
    start = time.monotonic()
    with httpx.stream("POST", fe.url + "/v1/chat/completions", timeout=30,
                      json={"model": MODEL, "messages": MSG, "max_tokens": 100, "stream": True}) as resp:
        assert resp.status_code == 200
        body = resp.read().decode()
    assert time.monotonic() - start < 4  # the engine alone would take ~12 s
    assert "data:" in body and "[DONE]" not in body.split("data:")[-2]
    wait_until(lambda: running(worker) == 0, 2.0, "cancelled in the engine")


def test_client_disconnect_cancels_in_the_engine(slow_workers: list[Process], broker: NatsServer,
                                                 frontends: Callable[..., Process]) -> None:
    worker = slow_workers[1]
    fe = frontends([worker], *nats_args(broker))
    with httpx.stream("POST", fe.url + "/v1/chat/completions", timeout=30,
                      json={"model": MODEL, "messages": MSG, "max_tokens": 200, "stream": True}) as resp:
        lines = resp.iter_lines()
        while not next(lines).startswith("data:"):
            pass
        assert running(worker) == 1
    wait_until(lambda: running(worker) == 0, 2.0, "cancelled after the client left")


def test_failover_when_nobody_listens_on_the_subject(tmp: Path, broker: NatsServer,
                                                     frontends: Callable[..., Process]) -> None:
    # The ghost's bridge listens on another broker: on ours nobody answers its subject.
    elsewhere = NatsServer(tmp / "nats-elsewhere.log")
    elsewhere.start()
    worker = start_mock(tmp, model=MODEL, args=(*FAST, *nats_args(broker)))
    ghost = start_mock(tmp, model=MODEL, args=(*FAST, *nats_args(elsewhere)))
    try:
        fe = frontends([worker, ghost], *nats_args(broker))
        c = client(fe)
        seen: set[str] = set()
        for _ in range(6):
            raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=3)
            seen.add(raw.headers["x-infera-worker"])
        assert seen == {get_json(worker.url + "/infera/worker")["instance_id"]}
        assert "no responder" in fe.output()
    finally:
        ghost.stop()
        worker.stop()
        elsewhere.stop()


def test_mixed_fleet_fails_loudly(tmp: Path, broker: NatsServer, slow_workers: list[Process],
                                  frontends: Callable[..., Process]) -> None:
    http_worker = start_mock(tmp, model=MODEL, args=FAST)
    try:
        fe = frontends([slow_workers[0], http_worker], *nats_args(broker), expect=1)
        http_id = get_json(http_worker.url + "/infera/worker")["instance_id"]
        wait_until(lambda: f"worker {http_id} is not routed to" in fe.output(), 5, "logged")
        assert "--request-transport http" in fe.output()
        fe_http = frontends([slow_workers[0], http_worker], expect=1)  # the reverse: an HTTP frontend
        nats_id = get_json(slow_workers[0].url + "/infera/worker")["instance_id"]
        wait_until(lambda: f"worker {nats_id} is not routed to" in fe_http.output(), 5, "logged")
        raw = client(fe_http).chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=2)
        assert raw.headers["x-infera-worker"] == http_id
    finally:
        http_worker.stop()


def test_broker_restart_mid_load_hangs_nothing(tmp_path: Path, frontends: Callable[..., Process]) -> None:
    broker = NatsServer(tmp_path / "nats-restart.log")
    broker.start()
    workers = [start_mock(tmp_path, model=MODEL, args=(*SLOW, *nats_args(broker))) for _ in range(2)]
    try:
        fe = frontends(workers, *nats_args(broker))
        c = client(fe)
        outcomes: list[tuple[str, float]] = []

        def stream() -> None:
            try:
                for _ in c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=100, stream=True):
                    pass
                outcomes.append(("completed", time.monotonic()))
            except Exception as exc:
                outcomes.append((type(exc).__name__, time.monotonic()))

        threads = [threading.Thread(target=stream) for _ in range(6)]
        for t in threads:
            t.start()
        wait_until(lambda: sum(running(w) for w in workers) == 6, 5, "all in flight")
        killed = time.monotonic()
        broker.kill()
        for t in threads:
            t.join(10)
        assert len(outcomes) == 6, "a request hung after the broker went away"
        assert all(kind != "completed" and at - killed < 5 for kind, at in outcomes), outcomes
        wait_until(lambda: sum(running(w) for w in workers) == 0, 3, "aborted in the engines")
        broker.start()

        def served() -> bool:
            try:
                c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2)
                return True
            except openai.APIError:
                return False

        wait_until(served, 20, "serving again after the broker came back")
    finally:
        for w in workers:
            w.stop()
        broker.stop()
