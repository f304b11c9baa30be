"""Inspection and operations endpoints: health, metrics, the worker registry, cache views.

Two probes: ``/livez`` answers 200 while the process serves (liveness: restart only a stuck
frontend, never one whose fleet is still loading its models); ``/health`` is readiness, 200
with the count of workers that can take a request now (listed and not cooling down after a
failure), 503 when there is none.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from infera.router.router import Router
from infera.server.errors import openai_error
from infera.server.metrics import ServerMetrics
from infera.server.responses import JsonResponse


class AdminHandlers:
    def __init__(self, router: Router, metrics: ServerMetrics) -> None:
        self.router = router
        self.metrics = metrics

    def routes(self) -> APIRouter:
        api = APIRouter()
        api.add_api_route("/health", self.health, methods=["GET"])
        api.add_api_route("/livez", self.livez, methods=["GET"])
        api.add_api_route("/metrics", self.prometheus, methods=["GET"])
        api.add_api_route("/v1/workers", self.workers, methods=["GET"])
        api.add_api_route("/v1/admin/cache-view/{worker_id}", self.cache_view, methods=["GET"])
        return api

    async def health(self) -> JsonResponse:
        view = self.router.view
        count = sum(1 for w in view.workers() if w.cooldown_seconds <= 0)  # can take a request now
        body = {"status": "ok" if count else "no_workers", "workers": count, "models": view.models()}
        return JsonResponse(body, status_code=200 if count else 503)

    async def livez(self) -> JsonResponse:
        return JsonResponse({"status": "ok"})

    async def prometheus(self) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def workers(self) -> JsonResponse:
        out = [{**w.record.model_dump(mode="json"), "in_flight": w.in_flight, "kv_blocks_indexed": w.kv_blocks_indexed,
                "kv_events_stale": w.kv_events_stale, "cooldown_seconds": round(w.cooldown_seconds, 3)}
               for w in self.router.view.workers()]
        return JsonResponse({"object": "list", "data": out})

    async def cache_view(self, worker_id: str) -> JsonResponse:
        view = self.router.view.cache_view(worker_id)
        if view is None:
            return openai_error(404, f"no worker {worker_id!r} in the fleet", "not_found_error", "worker_id")
        return JsonResponse({"worker_id": worker_id, **view})
