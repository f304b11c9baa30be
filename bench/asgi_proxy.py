"""A minimal proxy of /v1/* to mock engines, round-robin, for comparing HTTP servers.

The same logic as an ASGI app (``app``: served by uvicorn or granian) and as a plain
aiohttp.web handler (``python -m bench.asgi_proxy --port P``), so the servers differ and
nothing else does. Engines come from ``PROXY_ENGINES`` (comma-separated base URLs).
Responses pass through: status, content-type, and the body (streamed chunk by chunk for
SSE). ``GET /health`` answers 200.
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

HEADERS = {"content-type": "application/json"}


class _Upstream:
    def __init__(self) -> None:
        self._urls = itertools.cycle(os.environ.get("PROXY_ENGINES", "http://127.0.0.1:1").split(","))
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # created inside the server's running loop
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256),
                                                  auto_decompress=False, skip_auto_headers=("User-Agent",))
        return self._session

    def url(self, path: str) -> str:
        return next(self._urls) + path


class App:
    """The ASGI app."""

    def __init__(self) -> None:
        self._up = _Upstream()

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        chunks = []
        more = True
        while more:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        async with self._up.session().post(self._up.url(scope["path"]), data=b"".join(chunks),
                                           headers=HEADERS) as resp:
            ctype = resp.headers.get("content-type", "application/json")
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", ctype.encode())]})
            if ctype.startswith("text/event-stream"):
                async for chunk in resp.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await send({"type": "http.response.body", "body": await resp.read()})


app = App()


def aiohttp_app() -> Any:
    from aiohttp import web

    up = _Upstream()

    async def health(_req: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def proxy(req: web.Request) -> web.StreamResponse:
        body = await req.read()
        async with up.session().post(up.url(req.path), data=body, headers=HEADERS) as resp:
            ctype = resp.headers.get("content-type", "application/json")
            if not ctype.startswith("text/event-stream"):
                return web.Response(body=await resp.read(), status=resp.status, headers={"content-type": ctype})
            out = web.StreamResponse(status=resp.status, headers={"content-type": ctype})
            await out.prepare(req)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    application = web.Application()
    application.router.add_get("/health", health)
    application.router.add_post("/{tail:.*}", proxy)
    return application


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    import uvloop
    from aiohttp import web

    uvloop.install()
    web.run_app(aiohttp_app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
