"""The ASGI app in-process (httpx's ASGI transport) with fakes at the seams: intake, errors and
response shapes of both APIs, streamed and not (the fast tier)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infera.router.router import Router, RouterOptions
from infera.server.app import build_app
from tests.fakes import MODEL, FakeFleet, FakeTransport, worker

NONCE = r"(?m)^nonce:[^\n]*\n?"
MAX_BODY = 64 * 1024


class App:
    def __init__(self, *workers: Any, mode: str = "auto", script: dict[str, Any] | None = None) -> None:
        self.fleet = FakeFleet(*workers)
        self.transport = FakeTransport(script, text="hello there")
        self.router = Router(self.fleet, self.transport, None, None, RouterOptions(mode=mode, policy="round-robin"),
                             rng=random.Random(1))
        self.app = build_app(self.router, max_body_bytes=MAX_BODY, strip_patterns=[NONCE])

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://infera")

    def idle(self) -> bool:
        return all(w.in_flight == 0 for w in self.router.view.workers()) and self.transport.open == 0


@pytest.fixture
async def one() -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    app = App(worker("w1"))
    async with app.client() as client:
        yield app, client


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
MESSAGES = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def events(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")
            and line != "data: [DONE]"]


# ---- OpenAI -----------------------------------------------------------------------------------

async def test_openai_chat_answers_with_the_worker_named(one: tuple[App, httpx.AsyncClient]) -> None:
    app, client = one
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 200 and resp.headers["x-infera-worker"] == "w1"
    assert resp.json()["choices"][0]["message"]["content"] == "hello there"
    assert app.idle()


async def test_openai_chat_streams_sse(one: tuple[App, httpx.AsyncClient]) -> None:
    app, client = one
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    pieces = [e["choices"][0]["delta"].get("content", "") for e in events(resp.text) if e["choices"]]
    assert "".join(pieces) == "hellothere" and resp.text.endswith("data: [DONE]\n\n")
    assert app.idle()


async def test_openai_completions(one: tuple[App, httpx.AsyncClient]) -> None:
    app, client = one
    resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "once", "max_tokens": 3})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "hello there"
    assert app.transport.calls[-1].path == "/v1/completions"


@pytest.mark.parametrize(("body", "status", "words", "param"), [
    (b"{not json", 400, "malformed JSON body", None),
    (b"[1, 2]", 400, "must be a JSON object", None),
    (orjson.dumps({"model": MODEL}), 400, "", "messages"),
    (orjson.dumps({**CHAT, "model": "nope"}), 404, "does not exist", "model"),
    (b"{" + b" " * MAX_BODY + b"}", 413, "exceeds", None),
])
async def test_openai_intake_errors(one: tuple[App, httpx.AsyncClient], body: bytes, status: int, words: str,
                                   param: str | None) -> None:
    app, client = one
    resp = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status
    error = resp.json()["error"]
    assert words in error["message"] and error["param"] == param and error["type"]
    assert app.transport.calls == []


async def test_openai_nonces_are_stripped_before_forwarding(one: tuple[App, httpx.AsyncClient]) -> None:
    app, client = one
    body = {**CHAT, "messages": [{"role": "system", "content": "nonce: 123\nbe brief"}, *CHAT["messages"]]}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert app.transport.calls[-1].body["messages"][0]["content"] == "be brief"


async def test_openai_routing_errors_keep_their_status_and_type() -> None:
    empty = App()
    async with empty.client() as client:
        resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 503 and resp.json()["error"]["message"] == "no workers are available"
    failing = App(worker("w1"), worker("w2"), script={"w1": "fail", "w2": "fail"})
    async with failing.client() as client:
        resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 502 and resp.json()["error"]["type"] == "upstream_error"
    assert failing.idle()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_direct_mode_errors_and_pairs_on_both_apis(path: str) -> None:
    app = App(worker("m1"), worker("p1", "prefill", connector="pull"), worker("d1", "decode", connector="pull"),
              mode="direct")
    body = CHAT if path.endswith("completions") else MESSAGES
    async with app.client() as client:
        unknown = await client.post(path, json=body, headers={"x-worker-instance-id": "nobody"})
        wrong = await client.post(path, json=body, headers={"x-worker-instance-id": "p1"})
        pair = await client.post(path, json=body, headers={"x-worker-instance-id": "d1",
                                                           "x-prefill-instance-id": "p1"})
    assert unknown.status_code == (503 if path.endswith("completions") else 529)
    assert wrong.status_code == 400 and "prefill worker" in wrong.text
    assert pair.status_code == 200, pair.text
    assert (pair.headers["x-infera-worker"], pair.headers["x-infera-prefill-worker"]) == ("d1", "p1")
    assert app.idle()


async def test_atom_chat_over_http_is_a_400_that_names_completions() -> None:
    app = App(worker("ap", "prefill", engine="atom", connector="pull"),
              worker("ad", "decode", engine="atom", connector="pull"))
    async with app.client() as client:
        resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 400 and "/v1/completions" in resp.json()["error"]["message"]


# ---- Anthropic --------------------------------------------------------------------------------

async def test_anthropic_message(one: tuple[App, httpx.AsyncClient]) -> None:
    app, client = one
    resp = await client.post("/v1/messages", json=MESSAGES)
    assert resp.status_code == 200 and resp.headers["x-infera-worker"] == "w1"
    message = resp.json()
    assert message["type"] == "message" and message["content"][0]["text"] == "hello there"
    assert app.idle()


async def test_anthropic_stream(one: tuple[App, httpx.AsyncClient]) -> None:
    app, client = one
    resp = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    kinds = [e["type"] for e in events(resp.text)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    text = "".join(e["delta"].get("text", "") for e in events(resp.text) if e["type"] == "content_block_delta")
    assert text == "hellothere"
    assert app.idle()


@pytest.mark.parametrize(("body", "status", "kind"), [
    (b"{not json", 400, "invalid_request_error"),
    (orjson.dumps({"model": MODEL, "messages": []}), 400, "invalid_request_error"),
    (orjson.dumps({**MESSAGES, "model": "nope"}), 404, "not_found_error"),
    (b"{" + b" " * MAX_BODY + b"}", 413, "request_too_large"),
])
async def test_anthropic_intake_errors(one: tuple[App, httpx.AsyncClient], body: bytes, status: int,
                                      kind: str) -> None:
    _, client = one
    resp = await client.post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == kind


async def test_anthropic_routing_errors() -> None:
    empty = App()
    async with empty.client() as client:
        resp = await client.post("/v1/messages", json=MESSAGES)
        streamed = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
    assert resp.status_code == 529 and resp.json()["error"]["type"] == "overloaded_error"
    assert streamed.status_code == 529
    failing = App(worker("w1"), script={"w1": "fail"})
    async with failing.client() as client:
        resp = await client.post("/v1/messages", json=MESSAGES)
    assert resp.status_code == 500 and resp.json()["error"]["type"] == "api_error"
    assert failing.idle()


# ---- read API over HTTP --------------------------------------------------------------------------

async def test_models_health_workers_and_metrics(one: tuple[App, httpx.AsyncClient]) -> None:
    _, client = one
    assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == [MODEL]
    assert (await client.get("/health")).json() == {"status": "ok", "workers": 1, "models": [MODEL]}
    workers = (await client.get("/v1/workers")).json()["data"]
    assert workers[0]["instance_id"] == "w1" and workers[0]["in_flight"] == 0
    assert (await client.get("/v1/admin/cache-view/nobody")).status_code == 404
    await client.post("/v1/chat/completions", json=CHAT)
    text = (await client.get("/metrics")).text
    assert 'infera_routing_decisions_total{policy="round-robin"' in text


async def test_openai_requests_and_tokens_are_counted_once_each(one: tuple[App, httpx.AsyncClient]) -> None:
    _, client = one
    await client.post("/v1/chat/completions", json=CHAT)
    await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    text = (await client.get("/metrics")).text
    # the relay saw [DONE]: the stream counts as a 200, not "incomplete"
    assert 'infera_requests_total{endpoint="/v1/chat/completions",status="200"} 2.0' in text
    assert "incomplete" not in text
    # usage: 3 + 3 prompt tokens; 1 (whole body) + 2 (two streamed words) completion tokens
    assert 'infera_tokens_total{endpoint="/v1/chat/completions",kind="prompt"} 6.0' in text
    assert 'infera_tokens_total{endpoint="/v1/chat/completions",kind="completion"} 3.0' in text


async def test_openai_histograms_count_each_request_once(one: tuple[App, httpx.AsyncClient]) -> None:
    _, client = one
    for _ in range(2):
        await client.post("/v1/chat/completions", json=CHAT)
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})  # a 404: no time to first byte
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families((await client.get("/metrics")).text)
               for s in family.samples if s.labels.get("endpoint") == "/v1/chat/completions"}

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted({"endpoint": "/v1/chat/completions", **labels}.items()))))

    assert value("infera_request_duration_seconds_count") == 6
    assert value("infera_request_duration_seconds_bucket", le="+Inf") == 6
    assert value("infera_time_to_first_token_seconds_count") == 4  # two whole answers, two streams
    assert value("infera_requests_total", status="200") == 4 and value("infera_requests_total", status="404") == 2
    assert value("infera_tokens_total", kind="prompt") == 12 and value("infera_tokens_total", kind="completion") == 6
    assert value("infera_tokens_total", kind="cached") is None  # no usage reported cached tokens: no series


# ---- client disconnects ----------------------------------------------------------------------------

async def leave_after_first_chunk(app: App, path: str, body: dict[str, Any]) -> list[bytes]:
    """Call the ASGI app directly; the client disconnects once the first body chunk arrives."""
    got_body = asyncio.Event()
    sent: list[bytes] = []
    request = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop()
        await got_body.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append(message["body"])
            got_body.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"host", b"infera")],
             "client": ("127.0.0.1", 1), "server": ("infera", 80)}
    await asyncio.wait_for(app.app(scope, receive, send), timeout=10)
    return sent


async def test_a_stream_that_ended_is_not_abandoned_when_receive_reports_the_end() -> None:
    # uvicorn's receive() answers http.disconnect once the response is complete: the relay, which
    # ends the response with the [DONE] chunk and then reads the upstream to its end, must not
    # take that for a client that left (closing the upstream, counting a 499).
    app = App(worker("w1"))
    complete = asyncio.Event()
    request = [{"type": "http.request", "body": orjson.dumps({**CHAT, "stream": True}), "more_body": False}]
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop()
        await complete.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))
            if not message.get("more_body"):
                complete.set()

    path = "/v1/chat/completions"
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"host", b"infera")],
             "client": ("127.0.0.1", 1), "server": ("infera", 80)}
    await asyncio.wait_for(app.app(scope, receive, send), timeout=10)
    assert b"".join(sent).endswith(b"data: [DONE]\n\n")
    async with app.client() as client:
        text = (await client.get("/metrics")).text
    assert 'infera_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in text
    assert app.idle()


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", {**CHAT, "stream": True}),
                                            ("/v1/messages", {**MESSAGES, "stream": True})])
async def test_a_client_that_leaves_mid_stream_releases_the_worker(path: str, body: dict[str, Any]) -> None:
    app = App(worker("w1"), script={"w1": "endless"})
    sent = await leave_after_first_chunk(app, path, body)
    assert sent  # the stream had started
    assert app.idle()
