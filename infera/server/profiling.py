"""``POST /v1/admin/profile/start`` and ``/stop``: the engines' own profilers, across the fleet.

403 unless the server runs with ``--enable-profiling``. Otherwise the call goes, concurrently,
to ``POST <http_url>/start_profile`` (or ``/stop_profile``) of every worker, or of those named
in ``workers``: the endpoints vLLM (with a profiler configured) and SGLang serve, and the mock
engine too. Every other field of the body is forwarded as the engine's JSON body (SGLang
reads ``output_dir``, ``num_steps``, ``activities``; vLLM ignores it).

The answer lists one result per worker: ``ok``, the engine's ``status`` and its ``response``
(JSON or text), or an ``error`` (unreachable, timed out, not in the fleet). 200 when every
worker succeeded, 207 when some did, 502 when none did (but the engines' own 4xx when every
engine refused the request, e.g. a profile already running: a client error, not a failure);
never one opaque 500. A bad request is
a 4xx before any engine is called: 400 for a body that is not a JSON object or a bad
``workers``, 404 when none of the named workers is in the fleet, 413 for a body over 64 KiB.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from fastapi import APIRouter, Request

from infera.protocols.worker import WorkerRecord
from infera.router.router import Router
from infera.server.errors import openai_error
from infera.server.intake import IntakeError, read_body
from infera.server.responses import JsonResponse

ENGINE_PATHS = {"start": "/start_profile", "stop": "/stop_profile"}
MAX_DETAIL = 2000  # characters of a non-JSON engine answer kept in the result
MAX_BODY = 64 * 1024  # a profiler's options are a few fields


class ProfilingHandlers:
    def __init__(self, router: Router, enabled: bool, timeout: float) -> None:
        self.router = router
        self.enabled = enabled
        self.timeout = timeout

    def routes(self) -> APIRouter:
        api = APIRouter()
        api.add_api_route("/v1/admin/profile/start", self.start, methods=["POST"])
        api.add_api_route("/v1/admin/profile/stop", self.stop, methods=["POST"])
        return api

    async def start(self, request: Request) -> JsonResponse:
        return await self._fan_out(request, "start")

    async def stop(self, request: Request) -> JsonResponse:
        return await self._fan_out(request, "stop")

    async def _fan_out(self, request: Request, action: str) -> JsonResponse:
        if not self.enabled:
            return openai_error(403, "profiling is disabled: start the server with --enable-profiling")
        try:
            raw = await read_body(request, MAX_BODY)
        except IntakeError as exc:
            return openai_error(exc.status, str(exc))
        try:
            body = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            return openai_error(400, f"malformed JSON body: {exc}")
        if not isinstance(body, dict):
            return openai_error(400, "the request body must be a JSON object")
        names = body.pop("workers", None)
        if names is not None and (not isinstance(names, list) or not names
                                  or not all(isinstance(n, str) for n in names)):
            return openai_error(400, "workers must be a non-empty list of worker instance ids", param="workers")
        fleet = self.router.view.records()
        if names is None:
            targets: list[tuple[str, WorkerRecord | None]] = sorted(fleet.items())
        else:
            targets = [(n, fleet.get(n)) for n in dict.fromkeys(names)]
            if all(worker is None for _, worker in targets):
                return openai_error(404, f"none of the workers {', '.join(map(repr, names))} is in the fleet",
                                    "not_found_error", "workers")
        if not targets:
            return openai_error(503, "no workers are available")
        forwarded = orjson.dumps(body)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            results = await asyncio.gather(*(
                self._call(session, wid, worker, ENGINE_PATHS[action], forwarded) for wid, worker in targets))
        ok = sum(1 for r in results if r["ok"])
        status = 200 if ok == len(results) else 207 if ok else _none_succeeded(results)
        return JsonResponse({"action": action, "ok": ok == len(results), "succeeded": ok, "failed": len(results) - ok,
                             "workers": results}, status_code=status)

    async def _call(self, session: aiohttp.ClientSession, wid: str, worker: WorkerRecord | None, path: str,
                    body: bytes) -> dict[str, Any]:
        if worker is None:
            return {"worker_id": wid, "ok": False, "status": None, "error": "not in the fleet"}
        url = worker.http_url.rstrip("/") + path
        out: dict[str, Any] = {"worker_id": wid, "url": url}
        try:
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
                text = await resp.text(errors="replace")
                out.update(ok=200 <= resp.status < 300, status=resp.status)
        except TimeoutError:
            return {**out, "ok": False, "status": None, "error": f"timed out after {self.timeout:g}s"}
        except aiohttp.ClientError as exc:
            return {**out, "ok": False, "status": None, "error": f"unreachable: {exc}"}
        try:
            out["response"] = orjson.loads(text) if text.strip() else None
        except orjson.JSONDecodeError:
            out["response"] = text[:MAX_DETAIL]
        if not out["ok"]:
            out["error"] = f"the engine answered {out['status']}"
        return out


def _none_succeeded(results: list[dict[str, Any]]) -> int:
    """The status when no worker succeeded: the engines' 4xx if every one refused alike (400 if they
    differ), 502 when any failed otherwise (unreachable, timed out, 5xx, not in the fleet)."""
    statuses = {r["status"] for r in results}
    if all(isinstance(s, int) and 400 <= s < 500 for s in statuses):
        return statuses.pop() if len(statuses) == 1 else 400
    return 502
