"""The frontend's probes, in process: /livez for liveness, /health for readiness."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from infera.discovery.base import FleetListener
from infera.protocols.worker import WorkerRecord
from infera.router.router import Router, RouterOptions
from infera.server.app import build_app
from infera.transport.base import UpstreamError, UpstreamResponse

MODEL = "m"


class Fleet:
    def __init__(self, *ids: str) -> None:
        self._workers = {i: WorkerRecord(instance_id=i, model=MODEL, http_url=f"http://{i}") for i in ids}

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def workers(self) -> dict[str, WorkerRecord]:
        return self._workers

    def subscribe(self, listener: FleetListener) -> None: ...


class Unreachable:
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, worker: WorkerRecord, path: str, body: bytes, headers: Mapping[str, str],
                   started: float | None = None) -> UpstreamResponse:
        raise UpstreamError(f"worker {worker.instance_id} is unreachable")


def client(fleet: Fleet) -> httpx.AsyncClient:
    router = Router(fleet, Unreachable(), None, None, RouterOptions(policy="round-robin", max_retries=0))
    app = build_app(router, max_body_bytes=1 << 20, strip_patterns=())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://frontend")


async def test_livez_is_200_while_the_fleet_is_empty_and_health_is_503() -> None:
    async with client(Fleet()) as c:
        assert (await c.get("/livez")).status_code == 200
        health = await c.get("/health")
        assert health.status_code == 503 and health.json()["workers"] == 0


async def test_health_counts_only_workers_that_can_take_a_request_now() -> None:
    async with client(Fleet("a", "b")) as c:
        assert (await c.get("/health")).json()["workers"] == 2
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 502  # one worker cools down
        health = await c.get("/health")
        assert health.status_code == 200 and health.json()["workers"] == 1
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 502  # the other one too
        health = await c.get("/health")
        assert health.status_code == 503 and health.json()["workers"] == 0
        assert (await c.get("/livez")).status_code == 200
