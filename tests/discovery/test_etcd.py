"""etcd discovery against a real etcd: the registrar and the fleet view, in-process."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from harness import EtcdServer, await_until
from infera.discovery.base import FleetChange
from infera.discovery.etcd import EtcdFleet
from infera.discovery.etcd_client import WORKERS_PREFIX, EtcdClient
from infera.discovery.etcd_registrar import EtcdRegistrar
from infera.protocols.worker import KvEventEndpoint, WorkerRecord


def record(worker_id: str, port: int = 30001, **extra: object) -> WorkerRecord:
    return WorkerRecord(instance_id=worker_id, model="m", engine="mock", http_url=f"http://127.0.0.1:{port}",
                        kv_events=KvEventEndpoint(endpoint="tcp://127.0.0.1:5557"), **extra)  # type: ignore[arg-type]


async def eventually(cond: Callable[[], bool], limit: float = 5.0, what: str = "condition") -> float:
    """Seconds until ``cond()`` held; fails after ``limit`` seconds."""
    return await await_until(cond, limit, what)


async def test_register_update_deregister(etcd: EtcdServer) -> None:
    fleet = EtcdFleet(etcd.endpoint)
    changes: list[FleetChange] = []
    fleet.subscribe(changes.append)
    await fleet.start()
    reg = EtcdRegistrar(etcd.endpoint, ttl=5)
    try:
        await reg.register(record("w1"))
        took = await eventually(lambda: "w1" in fleet.workers(), what="w1 routable")
        print(f"\nregister -> routable: {took * 1000:.1f} ms")
        assert took < 1.0
        assert fleet.workers()["w1"].http_url == "http://127.0.0.1:30001"
        await reg.update(record("w1", kv_block_size=32))
        await eventually(lambda: fleet.workers()["w1"].kv_block_size == 32, what="update seen")
        start = time.monotonic()
        await reg.deregister()
        await eventually(lambda: "w1" not in fleet.workers(), limit=1.0, what="w1 gone")
        assert time.monotonic() - start < 1.0
        assert [c.kind for c in changes] == ["add", "update", "remove"]
        client = EtcdClient(etcd.endpoint)
        assert await client.get(WORKERS_PREFIX + "w1") is None  # key deleted, lease revoked
        await client.close()
    finally:
        await fleet.stop()


async def test_heartbeat_keeps_the_record_past_its_ttl(etcd: EtcdServer) -> None:
    reg = EtcdRegistrar(etcd.endpoint, ttl=2)
    await reg.register(record("w1"))
    client = EtcdClient(etcd.endpoint)
    try:
        await asyncio.sleep(5)  # not a wait for an event: 2.5 TTLs must pass for the heartbeat to matter
        assert await client.get(WORKERS_PREFIX + "w1") is not None
        assert reg.lease_id is not None and await client.keepalive(reg.lease_id) > 0
        assert reg.registrations == 1  # kept alive, never re-created
    finally:
        await reg.deregister()
        await client.close()


async def test_lost_lease_is_re_registered(etcd: EtcdServer) -> None:
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    reg = EtcdRegistrar(etcd.endpoint, ttl=3)
    client = EtcdClient(etcd.endpoint)
    try:
        await reg.register(record("w1"))
        await eventually(lambda: "w1" in fleet.workers())
        assert reg.lease_id is not None
        await client.revoke(reg.lease_id)  # as if the lease expired while the worker was cut off
        await eventually(lambda: "w1" not in fleet.workers(), what="revoked record gone")
        await eventually(lambda: "w1" in fleet.workers(), limit=3.0, what="w1 re-registered")
        assert reg.registrations == 2
        await client.delete(WORKERS_PREFIX + "w1")  # key deleted, lease alive
        await eventually(lambda: "w1" not in fleet.workers())
        await eventually(lambda: "w1" in fleet.workers(), limit=3.0, what="w1 re-written")
    finally:
        await reg.deregister()
        await client.close()
        await fleet.stop()


async def test_etcd_restart_keeps_the_view_and_resumes_the_watch(etcd: EtcdServer) -> None:
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    reg1, reg2 = EtcdRegistrar(etcd.endpoint, ttl=3), EtcdRegistrar(etcd.endpoint, ttl=3)
    try:
        await reg1.register(record("w1"))
        await eventually(lambda: "w1" in fleet.workers())
        relists = fleet.relists
        await asyncio.to_thread(etcd.kill)
        await eventually(lambda: not fleet.synced.is_set(), what="the watch to notice etcd is gone")
        assert set(fleet.workers()) == {"w1"}  # etcd down: the last view still routes
        await asyncio.to_thread(etcd.start)
        await eventually(lambda: fleet.synced.is_set(), limit=5.0, what="watch resumed")
        assert fleet.relists == relists  # resumed from its revision, not relisted
        await reg2.register(record("w2", port=30002))
        took = await eventually(lambda: "w2" in fleet.workers(), what="w2 seen after restart")
        assert took < 1.0
        await asyncio.sleep(4)  # not a wait for an event: past w1's TTL, its heartbeat survived the restart
        assert set(fleet.workers()) == {"w1", "w2"}
    finally:
        await reg1.deregister()
        await reg2.deregister()
        await fleet.stop()


async def test_fresh_etcd_gets_every_worker_back(etcd: EtcdServer) -> None:
    """etcd replaced by an empty one on the same address: workers re-register, the view relists."""
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    reg = EtcdRegistrar(etcd.endpoint, ttl=3)
    client = EtcdClient(etcd.endpoint)
    try:
        await reg.register(record("w1"))
        for i in range(20):  # push the old store's revision above what the new one will reach
            await client.put(f"/other/{i}", b"x")
        await eventually(lambda: "w1" in fleet.workers())
        await asyncio.to_thread(etcd.kill)
        etcd.data_dir = etcd.data_dir.with_name("etcd-data-fresh")
        await asyncio.to_thread(etcd.start)
        await eventually(lambda: reg.registrations == 2, limit=5.0, what="re-registered in the new etcd")
        await eventually(lambda: fleet.relists >= 2 and "w1" in fleet.workers(), limit=5.0, what="relisted")
        await reg.update(record("w1", kv_block_size=64))
        await eventually(lambda: fleet.workers()["w1"].kv_block_size == 64, what="watch live on the new store")
    finally:
        await reg.deregister()
        await client.close()
        await fleet.stop()


async def test_compacted_revision_relists(etcd: EtcdServer) -> None:
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    reg = EtcdRegistrar(etcd.endpoint, ttl=5)
    client = EtcdClient(etcd.endpoint)
    try:
        await reg.register(record("w1"))
        await eventually(lambda: "w1" in fleet.workers())
        for i in range(5):  # revisions the fleet's watch does not see (outside its prefix)
            await client.put(f"/other/{i}", b"x")
        await client._client.compact(await client.revision())
        relists = fleet.relists
        await asyncio.to_thread(etcd.restart)  # the watch breaks; resuming needs a compacted revision
        await eventually(lambda: fleet.relists > relists and fleet.synced.is_set(), limit=5.0, what="relisted")
        assert set(fleet.workers()) == {"w1"}
    finally:
        await reg.deregister()
        await client.close()
        await fleet.stop()


async def test_two_views_over_one_etcd_agree(etcd: EtcdServer) -> None:
    a, b = EtcdFleet(etcd.endpoint), EtcdFleet(etcd.endpoint)
    await a.start()
    regs = [EtcdRegistrar(etcd.endpoint, ttl=5) for _ in range(3)]
    try:
        await regs[0].register(record("w0", port=30000))
        await b.start()  # joins late: lists what exists, then watches
        for i, reg in enumerate(regs[1:], start=1):
            await reg.register(record(f"w{i}", port=30000 + i))
        await eventually(lambda: len(a.workers()) == 3 and len(b.workers()) == 3)
        await regs[1].deregister()
        await eventually(lambda: set(a.workers()) == set(b.workers()) == {"w0", "w2"})
        assert a.workers() == b.workers()
    finally:
        for reg in (regs[0], regs[2]):
            await reg.deregister()
        await a.stop()
        await b.stop()


async def test_bad_records_are_skipped_with_a_log_line(etcd: EtcdServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="infera.discovery.etcd")
    client = EtcdClient(etcd.endpoint)
    await client.put(WORKERS_PREFIX + "junk-at-start", b"\xff not json")
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    reg = EtcdRegistrar(etcd.endpoint, ttl=5)
    try:
        await client.put(WORKERS_PREFIX + "future", record("future").model_dump_json().replace(
            '"version":1', '"version":99').encode())
        await client.put(WORKERS_PREFIX + "invalid", b'{"instance_id": "invalid", "model": "m"}')  # no http_url
        await client.put(WORKERS_PREFIX + "list", b"[1, 2]")
        await reg.register(record("good"))
        await eventually(lambda: "good" in fleet.workers(), what="a good record after bad ones")
        assert set(fleet.workers()) == {"good"}
        text = caplog.text
        assert "junk-at-start" in text and "not JSON" in text
        assert "future" in text and "version 99" in text
        assert "invalid" in text and "http_url" in text
        assert "/list" in text and "not a JSON object" in text
        assert fleet.synced.is_set()  # the watcher is alive
        # a live worker whose record turns bad leaves the view, and comes back when fixed
        await client.put(WORKERS_PREFIX + "good", b"{oops")
        await eventually(lambda: "good" not in fleet.workers())
        await reg.update(record("good"))
        await eventually(lambda: "good" in fleet.workers())
    finally:
        await reg.deregister()
        await client.close()
        await fleet.stop()


async def test_fleet_starts_while_etcd_is_down(etcd: EtcdServer) -> None:
    await asyncio.to_thread(etcd.kill)
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()  # does not raise: the frontend serves (503) until workers appear
    reg = EtcdRegistrar(etcd.endpoint, ttl=3)
    try:
        assert fleet.workers() == {}
        await reg.register(record("w1"))  # etcd down: returns, and registers when it answers
        await asyncio.to_thread(etcd.start)
        await eventually(lambda: "w1" in fleet.workers(), limit=6.0, what="w1 after etcd came up")
    finally:
        await reg.deregister()
        await fleet.stop()
