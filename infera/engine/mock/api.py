"""The mock engine's HTTP app (plain Starlette + orjson: the least CPU per request).

Besides the OpenAI and SGLang endpoints: ``/health`` and ``/livez`` (both 200 while it serves),
``/metrics`` (vLLM names), ``/v1/models``, ``/tokenize``, ``/version``, ``POST /reset_prefix_cache``
and ``GET /infera/worker`` (the worker record: where the KV-event and replay sockets are) and
``GET /infera/kv_cache`` (debug: the hashes of the cached blocks), and the reliability suite's
fault knobs and request ledger (``/infera/faults``, ``/infera/requests``: :mod:`.faults`).
Every error is OpenAI-shaped, and no bad request stops the engine.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infera.engine.mock.fault_api import FaultEndpoints
from infera.engine.mock.faults import FaultGate
from infera.engine.mock.kvd_server import KvdServer
from infera.engine.mock.openai_api import OpenAiEndpoints
from infera.engine.mock.profiler import ProfileEndpoints
from infera.engine.mock.responses import error_response, json_body, json_response
from infera.engine.mock.service import ApiError, MockService
from infera.engine.mock.sglang_api import SglangEndpoints

log = logging.getLogger(__name__)

VERSION = "0.32.0+infera.mock"


class InfoEndpoints:
    def __init__(self, service: MockService) -> None:
        self.s = service

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return json_response({"version": VERSION})

    async def models(self, request: Request) -> Response:
        s = self.s
        return json_response({"object": "list", "data": [{
            "id": s.model, "object": "model", "created": s.created, "owned_by": "infera",
            "root": s.settings.model_path or s.model, "parent": None, "max_model_len": s.settings.max_model_len,
        }]})

    async def worker(self, request: Request) -> Response:
        return json_response(self.s.record.model_dump(mode="json"))

    async def kv_cache(self, request: Request) -> Response:
        """Debug view of the cache: every cached block's event hash (what a KV-event consumer should hold)."""
        pool = self.s.engine.pool
        return json_response({"block_size": pool.block_size, "usable_blocks": pool.num_usable,
                              "free_blocks": pool.num_free, "cached": sorted(pool.cached_hashes()),
                              "next_seq": self.s.engine.publisher.next_seq if self.s.engine.publisher else None})

    async def metrics(self, request: Request) -> Response:
        s = self.s
        m, sched = s.engine.metrics, s.engine.scheduler
        m.running.set(len(sched.running))
        m.waiting.set(len(sched.waiting))
        m.kv_usage.set(s.engine.pool.usage)
        return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def tokenize(self, request: Request) -> Response:
        s = self.s
        body = await json_body(request)
        s.check_model(body)
        ids = s.chat_prompt(body) if "messages" in body else s.text_prompt(body)
        return json_response({"count": len(ids), "max_model_len": s.settings.max_model_len, "tokens": ids,
                              "token_strs": None})

    async def reset_prefix_cache(self, request: Request) -> Response:
        ok = self.s.engine.reset_prefix_cache()
        return json_response({"success": ok})


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(ApiError(exc.detail or "error", status=exc.status_code))


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s", request.url.path)
    return error_response(ApiError(f"internal error: {exc}", status=500))


def build_app(service: MockService, kvd: KvdServer | None = None) -> Starlette:
    """``kvd``: the kvd socket to serve for the app's lifetime (and its ``GET /infera/host_tier`` view)."""
    oai, sgl, info = OpenAiEndpoints(service), SglangEndpoints(service), InfoEndpoints(service)
    faults = FaultEndpoints(service.engine.faults, service.engine.faults_changed)
    routes = [
        Route("/v1/completions", oai.completions, methods=["POST"]),
        Route("/v1/chat/completions", oai.chat, methods=["POST"]),
        Route("/v1/models", info.models, methods=["GET"]),
        Route("/health", info.health, methods=["GET"]),
        Route("/livez", info.health, methods=["GET"]),
        Route("/version", info.version, methods=["GET"]),
        Route("/metrics", info.metrics, methods=["GET"]),
        Route("/tokenize", info.tokenize, methods=["POST"]),
        Route("/reset_prefix_cache", info.reset_prefix_cache, methods=["POST"]),
        Route("/infera/worker", info.worker, methods=["GET"]),
        Route("/infera/kv_cache", info.kv_cache, methods=["GET"]),
        Route("/generate", sgl.generate, methods=["POST"]),
        Route("/get_model_info", sgl.model_info, methods=["GET"]),
        Route("/get_server_info", sgl.server_info, methods=["GET"]),
        Route("/infera/faults", faults.get, methods=["GET"]),
        Route("/infera/faults", faults.post, methods=["POST"]),
        Route("/infera/requests", faults.requests, methods=["GET"]),
        *service.role.routes(),
    ]
    if service.engine.profiler is not None:
        prof = ProfileEndpoints(service.engine.profiler)
        routes += [Route("/start_profile", prof.start, methods=["POST"]),
                   Route("/stop_profile", prof.stop, methods=["POST"])]
    if kvd is not None:
        routes.append(Route("/infera/host_tier", kvd.view, methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.engine.start()
        if kvd is not None:
            await kvd.start()
        try:
            yield
        finally:
            if kvd is not None:
                await kvd.stop()
            await service.engine.stop()

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, Exception: _server_error,
    })
    app.add_middleware(FaultGate, faults=service.engine.faults)
    return app
