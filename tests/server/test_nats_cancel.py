"""A client that leaves a non-streamed request over NATS: the engine stops, the admission slot frees.

The frontend waits for a non-streamed answer's head frame inside the transport's send; the
bridge sends it when the engine has answered. A client that leaves before then must still
cancel the request in the engine and give back its ``--nats-req-max-pending`` slot, or the
worker answers 429 for good after that many departures.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import openai
import pytest

from harness import NatsServer, Process, start_frontend, start_mock, wait_until
from tests.server.test_nats import MODEL, MSG, SLOW, nats_args, running

pytestmark = pytest.mark.slow  # spawns a NATS server, mock engines and frontends (e2e, by the tier plugin)

# Prefill in steps of 64 tokens, ~0.35 s each: a long prompt takes ~10 s and an abort lands within a step.
CHUNKED = (*SLOW, "--max-num-batched-tokens", "64")
LONG = [{"role": "user", "content": "Tell me about routers. " * 100}]


def leave_early(url: str, path: str, body: dict[str, object], engine: Process) -> None:
    """Send a non-streamed request, see ``engine`` run it, and hang up before the answer comes."""
    outcome: list[BaseException] = []

    def send() -> None:
        try:
            httpx.post(url + path, json=body, timeout=httpx.Timeout(10, read=1.5))
        except BaseException as exc:
            outcome.append(exc)

    client = threading.Thread(target=send)
    client.start()
    wait_until(lambda: running(engine) == 1, 1.4, "running the request")
    client.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.ReadTimeout), outcome


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 60}),
    ("/v1/messages", {"model": MODEL, "messages": MSG, "max_tokens": 60}),
], ids=["chat", "messages"])
def test_client_leaving_a_non_streamed_request_cancels_it_and_frees_the_slot(
        path: str, body: dict[str, object], tmp_path: Path, broker: NatsServer, procs: list[Process]) -> None:
    worker = start_mock(tmp_path, model=MODEL, args=(*SLOW, *nats_args(broker)))
    procs.append(worker)
    fe = start_frontend(tmp_path, [worker], policy="round-robin",
                        args=(*nats_args(broker), "--nats-req-max-pending", "1", "--request-max-retries", "0"))
    procs.append(fe)
    for _ in range(2):  # a leaked slot would make the second round a 429
        leave_early(fe.url, path, body, worker)
        wait_until(lambda: running(worker) == 0, 3.0, "cancelled in the engine after the client left")
    c = openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30)
    assert c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2).choices[0].message.content


def test_client_leaving_during_the_pull_prefill_leg_cancels_it(tmp_path: Path, broker: NatsServer,
                                                               procs: list[Process]) -> None:
    def start(role: str, speed: tuple[str, ...]) -> Process:
        proc = start_mock(tmp_path, model=MODEL, args=(*speed, "--role", role, "--connector", "pull",
                                                       *nats_args(broker)))
        procs.append(proc)
        return proc

    prefill, decode = start("prefill", CHUNKED), start("decode", SLOW)
    fe = start_frontend(tmp_path, [prefill, decode], policy="round-robin",
                        args=(*nats_args(broker), "--nats-req-max-pending", "1", "--request-max-retries", "0"))
    procs.append(fe)
    for _ in range(2):
        leave_early(fe.url, "/v1/chat/completions", {"model": MODEL, "messages": LONG, "max_tokens": 5}, prefill)
        wait_until(lambda: running(prefill) == 0, 3.0, "the prefill leg cancelled after the client left")
    assert running(decode) == 0
