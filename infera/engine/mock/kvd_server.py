"""The mock engine's kvd socket: prewarm hints (:mod:`infera.protocols.kvd`) in, warm blocks out.

A Unix stream socket; each connection sends hint lines and closes, nothing is answered.
Hints for another worker id, of another block size, or that do not decode are counted and
dropped. Valid ones wait in a bounded priority queue (higher ``priority`` first, then
arrival order; a full queue drops the newcomer) and are applied one at a time through the
:class:`~infera.engine.mock.host_tier.HostTier`: stage in host memory, wait the promotion
time, promote onto the device. Their KV events go out at once, each phase as one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import stat

from starlette.requests import Request
from starlette.responses import Response

from infera.config.engine import MockEngineSettings
from infera.engine.mock.engine import Engine
from infera.engine.mock.hashing import extend_digests
from infera.engine.mock.host_tier import HostTier
from infera.engine.mock.responses import json_response
from infera.protocols.kvd import MAX_LINE_BYTES, KvdDecodeError, PrewarmHint, decode_hint

log = logging.getLogger(__name__)

QUEUE_LIMIT = 1024


@dataclasses.dataclass
class KvdStats:
    hints_received: int = 0
    hints_applied: int = 0
    hints_other_worker: int = 0
    hints_invalid: int = 0
    hints_dropped: int = 0  # queue full

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class KvdServer:
    def __init__(self, path: str, worker_id: str, engine: Engine, tier: HostTier) -> None:
        self.path = path
        self.worker_id = worker_id
        self.engine = engine
        self.tier = tier
        self.stats = KvdStats()
        self._queue: asyncio.PriorityQueue[tuple[int, int, PrewarmHint]] = asyncio.PriorityQueue(QUEUE_LIMIT)
        self._order = itertools.count()
        self._server: asyncio.AbstractServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @classmethod
    def from_settings(cls, settings: MockEngineSettings, engine: Engine, worker_id: str) -> KvdServer | None:
        """The server ``--kvd-socket-path`` asks for, with its host tier; None without the flag."""
        if not settings.kvd_socket_path:
            return None
        tier = HostTier(engine.pool, settings.host_kv_blocks,
                        settings.host_promote_ms_per_block / 1000.0 / settings.speedup_ratio,
                        events=settings.kv_events)
        return cls(settings.kvd_socket_path, worker_id, engine, tier)

    async def view(self, request: Request) -> Response:
        """``GET /infera/host_tier``: the tier's blocks (event ids) and what the socket did."""
        tier = self.tier
        return json_response({"socket": self.path, "capacity": tier.capacity, "blocks": len(tier),
                              "hashes": sorted(tier.hashes()), **tier.stats.as_dict(), **self.stats.as_dict()})

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.stat(self.path).st_mode):  # a stale socket of a previous run
                os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._client, self.path, limit=MAX_LINE_BYTES + 1)
        self._task = asyncio.get_running_loop().create_task(self._apply_loop(), name="kvd-apply")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    async def drained(self) -> None:
        """Wait until every queued hint has been applied (tests and debugging)."""
        await self._idle.wait()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                self._take(line)
        except (ValueError, ConnectionError) as exc:  # an over-long line, a reset peer
            self.stats.hints_invalid += 1
            log.warning("kvd: dropped a connection: %s", exc)
        finally:
            writer.close()

    def _take(self, line: bytes) -> None:
        self.stats.hints_received += 1
        try:
            hint = decode_hint(line)
        except KvdDecodeError as exc:
            self.stats.hints_invalid += 1
            log.warning("kvd: invalid hint: %s", exc)
            return
        if hint.worker != self.worker_id:
            self.stats.hints_other_worker += 1
            log.debug("kvd: hint for %s ignored (this is %s)", hint.worker, self.worker_id)
            return
        if hint.block_size != self.tier.pool.block_size:
            self.stats.hints_invalid += 1
            log.warning("kvd: hint of block size %d ignored (this engine uses %d)", hint.block_size,
                        self.tier.pool.block_size)
            return
        try:
            self._queue.put_nowait((-hint.priority, next(self._order), hint))
        except asyncio.QueueFull:
            self.stats.hints_dropped += 1
            return
        self._idle.clear()

    async def _apply_loop(self) -> None:
        while True:
            _, _, hint = await self._queue.get()
            try:
                await self.apply(hint)
            except Exception:
                log.exception("kvd: applying a hint failed")
            if self._queue.empty():
                self._idle.set()

    async def apply(self, hint: PrewarmHint) -> int:
        """Stage, wait, promote; returns the number of blocks promoted onto the device."""
        tier, engine = self.tier, self.engine
        tokens = hint.token_ids()
        digests: list[bytes] = []
        extend_digests(digests, tokens, tier.pool.block_size)
        warm = tier.device_prefix(digests)
        tier.stats.blocks_already_warm += warm
        self.stats.hints_applied += 1
        if warm == len(digests):
            return 0
        end = tier.stage(digests, tokens, warm)
        engine.publish_pending(tier.take_events())
        if end > warm and tier.promote_seconds > 0:
            await asyncio.sleep((end - warm) * tier.promote_seconds)
        promoted = tier.promote(digests, tokens, end)
        engine.publish_pending()
        return promoted
