"""The NATS request timeouts as the reference defines them, against a real nats-server.

``--nats-req-idle-timeout`` bounds every wait for the next chunk, the first token's included
(the HTTP transport's ``--upstream-first-byte-timeout`` has no say over NATS);
``--nats-req-max-duration`` caps the client's whole request, retries included.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from harness import NatsServer, Process, start_frontend, start_mock, wait_until
from tests.server.test_nats import MODEL, MSG, SLOW, nats_args, running

pytestmark = pytest.mark.slow  # spawns a NATS server, mock engines and frontends (e2e, by the tier plugin)

GLACIAL = ("--speedup-ratio", "0.002")  # the first prefill step takes ~8 s


def test_idle_timeout_governs_the_wait_for_the_first_token(tmp_path: Path, broker: NatsServer,
                                                           procs: list[Process]) -> None:
    worker = start_mock(tmp_path, model=MODEL, args=(*SLOW, *nats_args(broker)))  # first token after ~0.3 s
    procs.append(worker)
    fe = start_frontend(tmp_path, [worker], policy="round-robin",
                        args=(*nats_args(broker), "--nats-req-idle-timeout", "10",
                              "--upstream-first-byte-timeout", "0.05", "--request-max-retries", "0"))
    procs.append(fe)
    with httpx.stream("POST", fe.url + "/v1/chat/completions", timeout=30,
                      json={"model": MODEL, "messages": MSG, "max_tokens": 3, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        assert "[DONE]" in resp.read().decode()


def test_idle_timeout_mid_stream_ends_the_stream_and_cancels(tmp_path: Path, broker: NatsServer,
                                                             procs: list[Process]) -> None:
    worker = start_mock(tmp_path, model=MODEL, args=(*SLOW, *nats_args(broker)))  # a token every ~0.12 s
    procs.append(worker)
    fe = start_frontend(tmp_path, [worker], policy="round-robin",
                        args=(*nats_args(broker), "--nats-req-idle-timeout", "1.5", "--request-max-retries", "0"))
    procs.append(fe)
    stall = threading.Thread(target=lambda: httpx.post(  # straight to the engine: one ~3 s prefill step
        worker.url + "/v1/completions", timeout=60, json={"model": MODEL, "prompt": "stall " * 1300,
                                                          "max_tokens": 5}))
    chunks, stalled = 0, 0.0
    with httpx.stream("POST", fe.url + "/v1/chat/completions", timeout=30,
                      json={"model": MODEL, "messages": MSG, "max_tokens": 200, "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            assert "[DONE]" not in line
            if line.startswith("data:"):
                chunks += 1
                if chunks == 3:
                    stall.start()  # the stream's next token waits behind that whole step
                    stalled = time.monotonic()
    assert 1.4 < time.monotonic() - stalled < 3.0  # the idle timeout, not the stall's end, ended the stream
    assert 3 <= chunks < 10
    wait_until(lambda: running(worker) == 1, 1.0, "the stream cancelled in the engine (the stall goes on)")
    stall.join(60)


def test_max_duration_is_one_cap_across_retries(tmp_path: Path, broker: NatsServer, procs: list[Process]) -> None:
    glacial = start_mock(tmp_path, model=MODEL, args=(*GLACIAL, *nats_args(broker)))
    slow = start_mock(tmp_path, model=MODEL, args=(*SLOW, *nats_args(broker)))  # answers in ~1.5 s
    procs += [glacial, slow]
    fe = start_frontend(tmp_path, [glacial, slow], policy="round-robin",
                        args=(*nats_args(broker), "--nats-req-idle-timeout", "2", "--nats-req-max-duration", "3",
                              "--request-max-retries", "1"))
    procs.append(fe)
    outcomes = []
    for _ in range(2):  # round-robin: one of the two tries the glacial worker first
        start = time.monotonic()
        resp = httpx.post(fe.url + "/v1/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": MSG, "max_tokens": 10})
        outcomes.append((resp.status_code, resp.text))
        assert time.monotonic() - start < 3.8, outcomes
    # After 2 s of idle wait on the glacial worker, 1 s is left: too little for the slow one's 1.5 s.
    assert any(status == 504 and "max duration" in text for status, text in outcomes), outcomes
    wait_until(lambda: running(glacial) == 0 and running(slow) == 0, 3.0, "every attempt cancelled")
