"""etcd v3 plumbing shared by the etcd fleet view and the etcd registrar.

A thin typed layer over aetcd (an asyncio gRPC client) so that the rest of infera sees
plain values and one error type: :class:`EtcdUnavailable` for anything that means "etcd
cannot answer right now" (down, restarting, timed out) and :class:`EtcdCompacted` when a
watch asks for a revision etcd no longer keeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, Literal

import aetcd  # type: ignore[import-untyped]
import aetcd.exceptions  # type: ignore[import-untyped]

WORKERS_PREFIX = "/infera/workers/"


class EtcdUnavailable(Exception):
    """etcd did not answer (refused, reset, timed out); retry later."""


class EtcdCompacted(Exception):
    """The requested watch revision is compacted away; relist and watch from the list's revision."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted (oldest kept: {compact_revision})")
        self.compact_revision = compact_revision


@dataclasses.dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int


@dataclasses.dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    key: str
    value: bytes
    revision: int


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` or ``http://host:port`` (the first of a comma-separated list) -> (host, port)."""
    first = endpoint.split(",")[0].strip()
    for scheme in ("http://", "https://"):
        if first.startswith(scheme):
            first = first[len(scheme):]
    first = first.rstrip("/")
    host, sep, port = first.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"etcd endpoint must be host:port, got {endpoint!r}")
    return host.strip("[]"), int(port)


def _translate(exc: BaseException) -> Exception:
    if isinstance(exc, aetcd.exceptions.RevisionCompactedError):
        return EtcdCompacted(int(getattr(exc, "compacted_revision", 0) or 0))
    return EtcdUnavailable(f"{type(exc).__name__}: {exc}")


class EtcdClient:
    """One connection to etcd. Every call raises :class:`EtcdUnavailable` rather than hanging
    longer than ``timeout`` seconds (watch streams excepted: they end with it)."""

    def __init__(self, endpoint: str, timeout: float = 2.0) -> None:
        host, port = parse_endpoint(endpoint)
        self.endpoint = f"{host}:{port}"
        self._timeout = timeout
        self._client: Any = aetcd.Client(host=host, port=port, timeout=max(1, round(timeout)),
                                         connect_wait_timeout=max(1, round(timeout)))

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._client.close(), self._timeout)
        except (TimeoutError, Exception):
            pass

    async def _call(self, coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, self._timeout)
        except TimeoutError as exc:
            raise EtcdUnavailable(f"no answer within {self._timeout}s") from exc
        except aetcd.exceptions.ClientError as exc:
            raise _translate(exc) from exc

    async def revision(self) -> int:
        """The store's current revision (cheap: a one-key range)."""
        result = await self._call(self._client.get_range(b"\0", b"\1"))
        return int(result.header.revision)

    async def list_prefix(self, prefix: str) -> tuple[int, list[KeyValue]]:
        """Every key under ``prefix`` and the revision the listing reflects."""
        result = await self._call(self._client.get_prefix(prefix.encode()))
        items = [KeyValue(kv.key.decode(errors="replace"), bytes(kv.value), int(kv.mod_revision)) for kv in result]
        return int(result.header.revision), items

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Open a watch on ``prefix`` from ``start_revision`` (inclusive); iterate it for events until
        the stream breaks, which raises :class:`EtcdUnavailable` or :class:`EtcdCompacted`."""
        watch = await self._call(self._client.watch_prefix(prefix.encode(), start_revision=start_revision))
        return self._events(watch)

    async def _events(self, watch: Any) -> AsyncIterator[WatchEvent]:
        try:
            async for event in watch:
                kind: Literal["put", "delete"] = "put" if str(event.kind).upper().endswith("PUT") else "delete"
                kv = event.kv
                yield WatchEvent(kind, kv.key.decode(errors="replace"), bytes(kv.value), int(kv.mod_revision))
        except aetcd.exceptions.ClientError as exc:
            raise _translate(exc) from exc
        finally:
            try:
                await asyncio.wait_for(watch.cancel(), self._timeout)
            except (TimeoutError, Exception):
                pass
        raise EtcdUnavailable("watch stream ended")

    async def grant(self, ttl: int) -> int:
        lease = await self._call(self._client.lease(ttl))
        return int(lease.id)

    async def keepalive(self, lease_id: int) -> int:
        """Refresh a lease; its remaining TTL in seconds, 0 when etcd no longer has it."""
        reply = await self._call(self._client.refresh_lease(lease_id))
        return int(getattr(reply, "TTL", 0) or 0)

    async def put(self, key: str, value: bytes, lease_id: int | None = None) -> None:
        await self._call(self._client.put(key.encode(), value, lease=lease_id))

    async def get(self, key: str) -> bytes | None:
        result = await self._call(self._client.get(key.encode()))
        return None if result is None else bytes(result.value)

    async def delete(self, key: str) -> None:
        await self._call(self._client.delete(key.encode()))

    async def revoke(self, lease_id: int) -> None:
        await self._call(self._client.revoke_lease(lease_id))
