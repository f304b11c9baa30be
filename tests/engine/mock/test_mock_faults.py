"""The mock engine's fault knobs and request ledger, in-process."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from infera.engine.mock import faults as faults_module
from infera.engine.mock.faults import Faults
from infera.engine.mock.publisher import KvEventPublisher
from infera.protocols.kv_events import AllBlocksCleared


def test_knobs_apply_and_bad_values_change_nothing() -> None:
    f = Faults()
    f.apply({"slowdown": 10, "kv_events_paused": True})
    assert f.state() == {"slowdown": 10.0, "kv_events_paused": True, "hang": False}
    for bad in ({"slowdown": 0.5}, {"slowdown": True}, {"hang": "yes"}, {"hang": True, "bogus": 1}):
        with pytest.raises(ValueError, match=r"slowdown|hang|unknown"):
            f.apply(bad)
    assert f.state() == {"slowdown": 10.0, "kv_events_paused": True, "hang": False}
    f.apply({"slowdown": 1, "kv_events_paused": False})
    assert f.state() == {"slowdown": 1.0, "kv_events_paused": False, "hang": False}


async def test_hang_holds_waiters_until_lifted() -> None:
    f = Faults()
    await asyncio.wait_for(f.wait_running(), 1)  # not hung: returns at once
    f.apply({"hang": True})
    waiter = asyncio.ensure_future(f.wait_running())
    await asyncio.sleep(0)
    assert not waiter.done()
    f.apply({"hang": False})
    await asyncio.wait_for(waiter, 1)


def test_ledger_counts_repeats_and_keeps_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults_module, "LEDGER_SIZE", 3)
    f = Faults()
    for rid in ("a", "b", "a", "c", "d"):
        f.saw(rid)
    assert dict(f.ledger) == {"c": 1, "a": 2, "d": 1}  # "b" was the oldest
    assert f.total == 5


async def test_a_stalled_publisher_sends_its_batches_in_order_on_resume() -> None:
    pub = KvEventPublisher("127.0.0.1", "127.0.0.1", "kv")
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    try:
        for _ in range(200):  # the slow-joiner: publish until the SUB socket is connected
            pub.publish([AllBlocksCleared()])
            if await sub.poll(20):
                break
        while await sub.poll(50):
            last = int.from_bytes((await sub.recv_multipart())[1], "big")
        pub.hold(True)
        for _ in range(3):
            pub.publish([AllBlocksCleared()])
        assert not await sub.poll(100)  # stalled: nothing goes out
        pub.hold(False)
        seqs = [int.from_bytes((await asyncio.wait_for(sub.recv_multipart(), 2))[1], "big") for _ in range(3)]
        assert seqs == [last + 1, last + 2, last + 3]
    finally:
        sub.close(0)
        ctx.term()
        await pub.stop()
