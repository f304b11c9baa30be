"""``HttpTransport.get_json`` (discovery's checks) over the request path's pool answers what aiohttp's
``json()`` answered, and reuses one connection."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from infera.transport.http import HttpTransport

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)


class Answer:
    """What ``GET /doc`` answers now."""

    def __init__(self) -> None:
        self.status = 200
        self.content_type = "application/json"
        self.body = b"{}"
        self.chunked = False
        self.peers: list[object] = []


async def serve(answer: Answer) -> AsyncIterator[str]:
    async def doc(request: web.Request) -> web.StreamResponse:
        answer.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        if 300 <= answer.status < 400:
            raise web.HTTPFound("/moved")
        if not answer.chunked:
            return web.Response(status=answer.status, body=answer.body, headers={"Content-Type": answer.content_type})
        resp = web.StreamResponse(status=answer.status, headers={"Content-Type": answer.content_type})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(answer.body), 3):
            await resp.write(answer.body[i:i + 3])
        await resp.write_eof()
        return resp

    async def moved(request: web.Request) -> web.Response:
        return web.json_response({"moved": True})

    app = web.Application()
    app.router.add_get("/doc", doc)
    app.router.add_get("/moved", moved)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def outcome(get: Any, url: str) -> tuple[str, object]:
    try:
        return "ok", await get(url, 5.0)
    except Exception:
        return "error", None


@settings(max_examples=120, deadline=None)
@given(doc=JSON, status=st.sampled_from([200, 200, 200, 204, 302, 404, 503]),
       charset=st.sampled_from(["", "utf-8", "latin-1", "UTF-16", "bogus", '"utf-8"']),
       pad=st.sampled_from(["", " ", "\n\t "]), empty=st.booleans(), garbage=st.booleans(), chunked=st.booleans())
async def test_get_json_answers_what_aiohttp_answered(doc: object, status: int, charset: str, pad: str, empty: bool,
                                                      garbage: bool, chunked: bool) -> None:
    # A 204 sent with a chunked body is not HTTP: aiohttp fails it; the pool takes the 204 (no body, as
    # httptools reads it) and closes the connection when the stray chunks arrive.
    assume(not (status == 204 and chunked))
    answer = Answer()
    answer.status, answer.chunked = status, chunked
    answer.content_type = "application/json" + (f"; charset={charset}" if charset else "")
    encoding = charset.strip('"') if charset and charset != "bogus" else "utf-8"
    text = pad + ("" if empty else json.dumps({"naïve": doc}, ensure_ascii=False)) + pad  # not ASCII: charsets matter
    try:
        answer.body = text.encode(encoding) + (b"\xff{" if garbage else b"")
    except UnicodeEncodeError:
        answer.body = text.encode("utf-8")
    async for base in serve(answer):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=5)
        await transport.start()
        try:
            ours = await outcome(transport.get_json, base + "/doc")
            theirs = await outcome(transport._get_json_aiohttp, base + "/doc")
        finally:
            await transport.stop()
    assert ours == theirs


async def test_checks_reuse_one_connection_and_a_failure_raises() -> None:
    answer = Answer()
    answer.body = b'{"instance_id": "w"}'
    async for base in serve(answer):
        transport = HttpTransport(connect_timeout=2, first_byte_timeout=5)
        await transport.start()
        try:
            assert [await transport.get_json(base + "/doc", 5.0) for _ in range(4)] == [{"instance_id": "w"}] * 4
            answer.status = 503
            with pytest.raises(Exception, match="503"):
                await transport.get_json(base + "/doc", 5.0)
            answer.status = 302
            assert await transport.get_json(base + "/doc", 5.0) == {"moved": True}
            with pytest.raises(Exception):  # noqa: B017,PT011 (unreachable: any failure)
                await transport.get_json("http://127.0.0.1:1/doc", 5.0)
        finally:
            await transport.stop()
    assert len(answer.peers) == 7 and len(set(answer.peers[:6])) == 1  # the redirect: once more, by aiohttp
