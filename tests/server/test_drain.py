"""The frontend's drain on SIGTERM, in-process: while draining every response closes its connection
and readiness fails, so clients' pooled connections end after one more answer, never mid-request."""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send

from infera.server.drain import DrainMiddleware, DrainState


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"connection", b"keep-alive")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def call(mw: DrainMiddleware, path: str) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await mw({"type": "http", "path": path, "method": "GET", "headers": []}, receive, send)
    return sent


async def test_before_the_drain_responses_pass_untouched() -> None:
    state = DrainState()
    sent = await call(DrainMiddleware(app, state), "/v1/chat/completions")
    assert sent[0]["headers"] == [(b"connection", b"keep-alive")]
    assert state.quiet_for() < 5  # the request was seen


async def test_while_draining_every_response_closes_its_connection() -> None:
    state = DrainState()
    state.draining = True
    sent = await call(DrainMiddleware(app, state), "/v1/chat/completions")
    assert sent[0]["status"] == 200 and sent[0]["headers"] == [(b"connection", b"close")]
    assert sent[1]["body"] == b"ok"


async def test_while_draining_readiness_fails() -> None:
    state = DrainState()
    state.draining = True
    sent = await call(DrainMiddleware(app, state), "/health")
    assert sent[0]["status"] == 503 and (b"connection", b"close") in sent[0]["headers"]
