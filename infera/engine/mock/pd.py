"""Prefill and decode roles of a disaggregated pair, for both connectors.

``push`` (SGLang): the router sends the same request to both workers at once with
``bootstrap_host``/``bootstrap_port``/``bootstrap_room``. The prefill worker computes the
prompt (one token), and its bootstrap room (:mod:`infera.engine.mock.bootstrap`) tells the
decode worker the KV is ready.

``pull`` (vLLM NixlConnector): the router first sends the prefill worker the request with
``max_tokens: 1`` and ``kv_transfer_params: {"do_remote_decode": true, ...}``; the prefill
worker answers with ``kv_transfer_params`` naming its engine, side channel and the blocks
holding the prompt (``do_remote_prefill: true``, ``remote_engine_id``, ``remote_block_ids``,
``remote_host``, ``remote_port``); the router passes those to the decode worker.

Either way the decode worker waits ``--kv-transfer-ms-per-block`` per block received (scaled
by ``--speedup-ratio``), then schedules the request with those tokens already computed: they
take blocks (and so emit ``BlockStored`` events) but no prefill step time. A decode worker
given neither bootstrap fields nor transfer params computes the prompt itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from starlette.routing import BaseRoute

from infera.config.engine import MockEngineSettings
from infera.engine.mock.bootstrap import BootstrapRooms, RoomFailed, fetch_room
from infera.engine.mock.cache import BlockPool
from infera.engine.mock.engine import RequestHandle
from infera.engine.mock.service import ApiError
from infera.engine.mock.text import PlannedOutput
from infera.protocols.worker import WorkerRecord


def _transfer_params(body: dict[str, Any]) -> dict[str, Any] | None:
    params = body.get("kv_transfer_params")
    return params if isinstance(params, dict) else None


def _room(body: dict[str, Any]) -> int | None:
    room = body.get("bootstrap_room")
    return room if isinstance(room, int) and not isinstance(room, bool) else None


class PrefillRole:
    name = "prefill"

    def __init__(self, settings: MockEngineSettings, pool: BlockPool, record: WorkerRecord, host: str) -> None:
        self.connector = settings.connector
        self._pool = pool
        self._record = record
        self._host = host
        self._port = settings.port
        self.rooms = BootstrapRooms(settings.block_size)

    def admit(self, body: dict[str, Any], prompt_ids: list[int], output: PlannedOutput) -> PlannedOutput:
        if len(output.ids) <= 1:
            return output
        # A prefill worker computes the prompt and samples one token; the decode worker writes the rest.
        return dataclasses.replace(output, ids=output.ids[:1], pieces=output.pieces[:1], finish_reason="length",
                                   stop_reason=None)

    async def receive_kv(self, body: dict[str, Any], prompt_ids: list[int]) -> int:
        return 0

    def submitted(self, body: dict[str, Any], handle: RequestHandle) -> None:
        room = _room(body)
        if room is not None:
            self.rooms.attach(room, handle)

    def response_extras(self, body: dict[str, Any], handle: RequestHandle) -> dict[str, Any]:
        params = _transfer_params(body)
        if params is None or not params.get("do_remote_decode"):
            return {}
        seq = handle.seq
        held = self._pool.lookup(seq.digests[:seq.prompt_len // self._pool.block_size])
        return {"kv_transfer_params": {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [b.block_id for b in held],
            "remote_engine_id": self._record.instance_id,
            "remote_host": self._host,
            "remote_port": self._port,
            "tp_size": 1,
        }}

    def routes(self) -> list[BaseRoute]:
        return self.rooms.routes()


class DecodeRole:
    name = "decode"

    def __init__(self, settings: MockEngineSettings, pool: BlockPool, record: WorkerRecord, host: str) -> None:
        self.connector = settings.connector
        self._block_size = settings.block_size
        self._ms_per_block = settings.kv_transfer_ms_per_block / settings.speedup_ratio
        self._bootstrap_timeout = settings.bootstrap_timeout

    def admit(self, body: dict[str, Any], prompt_ids: list[int], output: PlannedOutput) -> PlannedOutput:
        return output

    async def receive_kv(self, body: dict[str, Any], prompt_ids: list[int]) -> int:
        blocks = await self._blocks_from_prefill(body)
        if not blocks:
            return 0
        if self._ms_per_block > 0:
            await asyncio.sleep(blocks * self._ms_per_block / 1000.0)
        return min(blocks * self._block_size, len(prompt_ids) - 1)

    async def _blocks_from_prefill(self, body: dict[str, Any]) -> int:
        params = _transfer_params(body)
        if params is not None and params.get("do_remote_prefill"):
            ids = params.get("remote_block_ids")
            return len(ids) if isinstance(ids, list) else 0
        room = _room(body)
        host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
        if room is None or not isinstance(host, str) or not isinstance(port, int):
            return 0
        try:
            info = await fetch_room(host, port, room, self._bootstrap_timeout)
        except RoomFailed as exc:
            raise ApiError(f"KV transfer failed: {exc}", status=502) from exc
        return int(info.get("blocks", 0))

    def submitted(self, body: dict[str, Any], handle: RequestHandle) -> None:
        return None

    def response_extras(self, body: dict[str, Any], handle: RequestHandle) -> dict[str, Any]:
        return {}

    def routes(self) -> list[BaseRoute]:
        return []
