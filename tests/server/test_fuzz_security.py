"""Security checks in-process: the admin token guards every admin path, is never logged, credentials go
only where they must, and request ids are propagated (issue 19, part 4)."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from infera.config.server import ServerSettings
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app, install_operations
from infera.server.auth import is_admin_path
from tests.fakes import MODEL, FakeFleet, FakeTransport, worker

TOKEN = "s3cret-admin-token-0123456789"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
MESSAGES = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


class App:
    def __init__(self, *workers: Any, token: str = TOKEN, profiling: bool = True) -> None:
        self.fleet = FakeFleet(*(workers or (worker("w1"),)))
        self.transport = FakeTransport(text="hello there")
        self.router = Router(self.fleet, self.transport, None, None, RouterOptions(policy="round-robin"),
                             rng=random.Random(1))
        self.app = build_app(self.router, max_body_bytes=64 * 1024, strip_patterns=[])
        install_operations(self.app, self.router, strip_patterns=[], admin_token=token, enable_profiling=profiling,
                           profile_timeout=5)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://infera")


def admin_operations(app: App) -> list[tuple[str, str]]:
    """Every admin (method, path) the server publishes, from its own OpenAPI document."""
    paths = app.app.openapi()["paths"]
    return sorted((method.upper(), path.replace("{worker_id}", "w1")) for path, item in paths.items()
                  for method in item if is_admin_path(path))


def test_the_published_admin_paths_are_the_ones_the_token_guards() -> None:
    ops = admin_operations(App())
    assert {path for _, path in ops} >= {"/v1/cache/prewarm", "/v1/admin/cache-view/w1", "/v1/admin/profile/start",
                                         "/v1/admin/profile/stop"}


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Bearer {TOKEN}x", TOKEN, f"bearer {TOKEN}", "Basic Zm9v"])
async def test_every_admin_path_refuses_without_the_token(auth: str | None) -> None:
    app = App()
    headers = {"authorization": auth} if auth is not None else {}
    async with app.client() as client:
        for method, path in admin_operations(app):
            resp = await client.request(method, path, json={"model": MODEL, "prompt": "x"}, headers=headers)
            assert resp.status_code == 401, (method, path, resp.text)
            assert resp.headers["www-authenticate"] == "Bearer"
            assert resp.json()["error"]["type"] == "authentication_error"
            assert resp.headers["x-request-id"]
    assert app.transport.calls == []


async def test_with_the_token_admin_paths_answer_and_public_ones_never_ask() -> None:
    app = App(profiling=False)
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with app.client() as client:
        assert (await client.get("/v1/admin/cache-view/w1", headers=auth)).status_code == 200
        assert (await client.post("/v1/admin/profile/start", headers=auth)).status_code == 403  # not enabled
        assert (await client.post("/v1/cache/prewarm", json={"model": MODEL, "prompt": "x"},
                                  headers=auth)).status_code == 503  # no kvd socket
        for path in ("/health", "/livez", "/metrics", "/v1/models", "/v1/workers"):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_the_token_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    app = App(worker("w1"), worker("w2"))
    app.transport.script["w1"] = "fail"  # a retry logs a warning with the request's story
    async with app.client() as client:
        for auth in (f"Bearer {TOKEN}", f"Bearer {TOKEN}-wrong"):
            await client.get("/v1/admin/cache-view/w1", headers={"authorization": auth})
            await client.post("/v1/admin/profile/start", json={"workers": ["nobody"]}, headers={"authorization": auth})
            await client.post("/v1/chat/completions", json=CHAT, headers={"authorization": auth})
            await client.post("/v1/messages", json=MESSAGES, headers={"x-api-key": auth})
    assert caplog.records, "the retry above must have logged something, or this test proves nothing"
    assert TOKEN not in caplog.text
    settings = ServerSettings(router_policy="round-robin", discovery_backend="static", worker_url=("http://x",),
                              admin_token=TOKEN)
    assert TOKEN not in repr(settings) and TOKEN not in str(dataclasses.asdict(settings).keys())


async def test_x_api_key_never_reaches_an_engine_and_authorization_only_on_inference() -> None:
    app = App()
    creds = {"authorization": "Bearer engine-key", "x-api-key": "sk-ant-client-key"}
    async with app.client() as client:
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=creds)).status_code == 200
        assert (await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"},
                                  headers=creds)).status_code == 200
        assert (await client.post("/v1/messages", json=MESSAGES, headers=creds)).status_code == 200
    assert len(app.transport.calls) == 3
    for call in app.transport.calls:
        assert "x-api-key" not in call.headers
        assert set(call.headers) <= {"content-type", "authorization", "x-request-id", "traceparent", "tracestate"}
        assert call.headers["authorization"] == "Bearer engine-key"  # an engine's own key (vLLM --api-key)


@pytest.fixture
async def engine() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A stand-in engine's profiler endpoints on 127.0.0.1, recording the headers it was sent."""
    seen: list[dict[str, str]] = []

    async def profile(request: web.Request) -> web.Response:
        seen.append({str(k): v for k, v in request.headers.items()})
        return web.json_response({"status": "started"})

    app = web.Application()
    app.router.add_post("/start_profile", profile)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_the_profile_fan_out_forwards_no_client_credentials(engine: tuple[str, list[dict[str, str]]]) -> None:
    url, seen = engine
    app = App(worker("w1").model_copy(update={"http_url": url}))
    headers = {"authorization": f"Bearer {TOKEN}", "x-api-key": "sk-client", "cookie": "a=b"}
    async with app.client() as client:
        resp = await client.post("/v1/admin/profile/start", json={"num_steps": 3}, headers=headers)
    assert resp.status_code == 200, resp.text
    assert len(seen) == 1
    sent = {k.lower(): v for k, v in seen[0].items()}
    assert "authorization" not in sent and "x-api-key" not in sent and "cookie" not in sent
    assert TOKEN not in orjson.dumps(seen).decode()


# ---- request ids ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_a_client_request_id_is_forwarded_and_returned(path: str) -> None:
    app = App()
    body = CHAT if "chat" in path else MESSAGES
    async with app.client() as client:
        resp = await client.post(path, json=body, headers={"x-request-id": "client-id-42"})
        streamed = await client.post(path, json={**body, "stream": True}, headers={"x-request-id": "client-id-43"})
    assert resp.status_code == 200 and resp.headers["x-request-id"] == "client-id-42"
    assert streamed.status_code == 200 and streamed.headers["x-request-id"] == "client-id-43"
    assert [c.headers["x-request-id"] for c in app.transport.calls] == ["client-id-42", "client-id-43"]


@pytest.mark.parametrize("given", [None, "", "x" * 129, "has space", "ctl\x01"])
async def test_a_missing_or_hostile_request_id_is_replaced_by_a_generated_one(given: str | None) -> None:
    app = App()
    headers = {"x-request-id": given} if given is not None else {}
    async with app.client() as client:
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        other = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    rid = resp.headers["x-request-id"]
    assert rid.startswith("req_") and len(rid) == 28 and rid != other.headers["x-request-id"]
    assert app.transport.calls[0].headers["x-request-id"] == rid


async def test_errors_carry_the_request_id_and_anthropic_bodies_name_it() -> None:
    app = App()
    rid = {"x-request-id": "trace-me"}
    async with app.client() as client:
        openai = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=rid)
        anthropic = await client.post("/v1/messages", json={**MESSAGES, "model": "nope"}, headers=rid)
        generated = await client.post("/v1/messages", content=b"{bad", headers={"content-type": "application/json"})
        unauthorized = await client.get("/v1/admin/cache-view/w1", headers=rid)
    assert openai.status_code == 404 and openai.headers["x-request-id"] == "trace-me"
    assert anthropic.status_code == 404 and anthropic.headers["x-request-id"] == "trace-me"
    assert anthropic.json()["request_id"] == "trace-me" and anthropic.json()["error"]["type"] == "not_found_error"
    assert int(anthropic.headers["content-length"]) == len(anthropic.content)
    assert generated.status_code == 400 and generated.json()["request_id"] == generated.headers["x-request-id"]
    assert unauthorized.status_code == 401 and unauthorized.headers["x-request-id"] == "trace-me"
