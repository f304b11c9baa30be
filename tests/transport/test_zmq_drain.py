"""A ZMQ socket's queued KV-event batches drained and applied by the index's C (``PrefixIndex.drain_socket``, and
``drain_stream`` for the ZMTP reader's streams).

Three frontends' worth of feeds follow the same real pyzmq publishers: one drains each link in C (a libzmq socket, or
the ZMTP reader's TCP stream), one reads a libzmq socket through pyzmq in Python, batch by batch (the source's own
loop, ``socket=None``: the reference), one reads the ZMTP stream in Python. Whatever the engines publish (in sequence
or not, payloads the C takes or leaves to Python, malformed messages), all must end with the same index, counters,
batch and gap counts, and the C path must have applied batches itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import await_until
from infera.kv.feed import IndexFeed
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    encode_batch,
    seq_to_bytes,
)
from infera.protocols.worker import KvEventEndpoint, WorkerRecord
from infera.transport.base import StreamState
from infera.transport.zmq_events import ZmqEventSource
from tests.fakes import MODEL, FakeFleet

TOPIC = b"kv-events"
BLOCK = 4

pytestmark = pytest.mark.skipif(not PrefixIndex().takes_sockets, reason="the index's C path is not built")


class Engine:
    """A worker's publisher: an XPUB (verbose, so each subscriber's subscription is seen), driven synchronously."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], wid: str) -> None:
        self.wid = wid
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0
        self.stored: list[int] = []  # engine hashes published as stored
        self.next_hash = 1 + 10**6 * int(wid[1:])
        self.last: list[bytes] | None = None

    def record(self) -> WorkerRecord:
        return WorkerRecord(instance_id=self.wid, model=MODEL, http_url=f"http://{self.wid}.invalid",
                            kv_events=KvEventEndpoint(endpoint=f"tcp://127.0.0.1:{self.port}", topic="kv-events"))

    async def subscribed(self, n: int) -> None:
        deadline = time.monotonic() + 5
        while n:
            while not self.pub.poll(0):
                assert time.monotonic() < deadline, "no subscription"
                await asyncio.sleep(0.005)
            if self.pub.recv()[:1] == b"\x01":
                n -= 1

    def send(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def payload(self, kind: str, k: int) -> bytes:
        if kind in ("store", "cpu"):
            hashes = list(range(self.next_hash, self.next_hash + k))
            self.next_hash += k
            parent = self.stored[-1] if self.stored and k % 2 else None
            tokens = [(h * 7 + j) % 50_000 for h in hashes for j in range(BLOCK)]
            self.stored += hashes
            ev: Any = BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=BLOCK,
                                  medium="CPU" if kind == "cpu" else "GPU")
            return encode_batch(EventBatch(ts=float(self.seq), events=[ev]))
        if kind == "remove":  # some stored, one never stored
            gone = [*self.stored[-k:], self.next_hash + 10**5]
            del self.stored[-k:]
            return encode_batch(EventBatch(ts=float(self.seq), events=[BlockRemoved(block_hashes=[h]) for h in gone]))
        if kind == "clear":
            self.stored.clear()
            return encode_batch(EventBatch(ts=float(self.seq), events=[AllBlocksCleared()]))
        if kind == "array":  # SGLang's array form: the C leaves it to the decoder
            hashes = list(range(self.next_hash, self.next_hash + k))
            self.next_hash += k
            self.stored += hashes
            tokens = [(h * 3 + j) % 50_000 for h in hashes for j in range(BLOCK)]
            return msgpack.packb([float(self.seq), [["BlockStored", hashes, None, tokens, BLOCK]]])  # type: ignore[no-any-return]
        assert kind == "bad"
        return b"\xc1\x00"

    def publish(self, op: str, k: int) -> None:
        if op == "skip":  # a gap: this seq is never sent (no replay socket: reported, the worker's view reset)
            self.seq += 1
            return
        if op == "dup":  # the last message again (seq below expected: skipped)
            if self.last is not None:
                self.send(self.last)
            return
        if op == "frames":
            self.send([TOPIC, seq_to_bytes(self.seq)])
            return
        if op == "seqlen":  # a seq frame of 4 bytes ends the stream (as the Python path does); kept last
            self.send([TOPIC, b"\x00\x00\x00\x01", b""])
            return
        self.last = [TOPIC, seq_to_bytes(self.seq), self.payload(op, k)]
        self.send(self.last)
        self.seq += 1


class Stack:
    """One frontend's feed over the engines: C drain (``native``) or the Python loop, over libzmq or ZMTP; a C drain
    over ZMTP a socket at a time, or every ready socket in one call at a catch-up (``ready``: through the feed's
    ``on_ready``; "bound": the catch-up the feed binds itself, the index's C bound once, as a frontend runs it)."""

    def __init__(self, engines: list[Engine], native: bool, zmtp: bool, ready: bool | str = False) -> None:
        self.index = PrefixIndex(block_size=BLOCK)
        self.source = ZmqEventSource(backstop=60.0, zmtp=zmtp)
        self.feed = IndexFeed(FakeFleet(*(e.record() for e in engines)), self.source, self.index)
        self.c_batches = 0
        if ready == "bound":
            bound = self.source._ready_sink
            assert isinstance(bound, functools.partial)  # not the feed's on_ready: no Python frame of ours a call

            def counted_bound(epfd: int, streams: dict[int, StreamState]) -> Any:
                before = sum(self.feed.batches.values())
                got = bound(epfd, streams)
                self.c_batches += sum(self.feed.batches.values()) - before
                return got

            self.source._ready_sink = counted_bound
        elif native:
            on_socket, on_stream = self.feed.on_socket, self.feed.on_stream

            def counted(wid: str, handle: int, expected: int | None) -> Any:
                before = self.feed.batches[wid]
                got = on_socket(wid, handle, expected)
                self.c_batches += self.feed.batches[wid] - before
                return got

            def counted_stream(wid: str, fd: int, buffer: bytearray, expected: int | None) -> Any:
                before = self.feed.batches[wid]
                got = on_stream(wid, fd, buffer, expected)
                self.c_batches += self.feed.batches[wid] - before
                return got

            def counted_ready(epfd: int, streams: dict[int, StreamState]) -> Any:
                before = sum(self.feed.batches.values())
                got = self.feed.on_ready(epfd, streams)
                self.c_batches += sum(self.feed.batches.values()) - before
                return got

            self.source.bind(self.feed.on_batch, self.feed.on_gap, self.feed.on_payload, counted, counted_stream,
                             counted_ready if ready else None)
        else:
            self.source.bind(self.feed.on_batch, self.feed.on_gap, self.feed.on_payload, None, None)

    async def start(self) -> None:
        await self.source.start()
        await self.feed.start()

    async def stop(self) -> None:
        await self.feed.stop()
        await self.source.stop()

    def state(self, engines: list[Engine]) -> dict[str, Any]:
        index = self.index
        workers = sorted(index.workers())
        probes = [e.stored[:8] for e in engines] + [list(range(1 + 10**6 * i, 9 + 10**6 * i)) for i in range(3)]
        return {
            "counters": index.counters.as_dict(),
            "workers": workers,
            "held": {w: (index.block_count(w), index.held(w)) for w in workers},
            "views": {w: {k: v for k, v in index.cache_view(w).items() if k != "last_event_at"} for w in workers},
            "ts": {w: index._workers[w].last_event_ts for w in workers},
            "batches": dict(self.feed.batches),
            "fed": sorted(self.feed._last_batch),  # the workers a batch came from, and those still owed one
            "owed": sorted(self.feed._expect_since),
            "gaps": dict(self.feed.gaps),
            "probes": [str(index.overlaps(p)) for p in probes],
        }


@pytest.fixture
async def zctx() -> AsyncIterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(0)


OP = st.one_of(
    st.tuples(st.sampled_from(["store", "store", "store", "remove", "cpu", "clear", "array", "bad", "skip", "dup",
                               "frames"]), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("decide"), st.just(0), st.just(0)),
    st.tuples(st.just("expect"), st.integers(0, 2), st.just(0)),  # the worker computed an uncached prompt
)


@contextlib.asynccontextmanager
async def three_stacks(zctx: zmq.Context[zmq.Socket[bytes]],
                       zmtp: bool) -> AsyncIterator[tuple[list[Engine], list[Stack]]]:
    """Three engines, and three feeds following them: one draining in C (over ZMTP if ``zmtp``, else libzmq), one
    through the pyzmq loop, one through the ZMTP reader's Python loop; over ZMTP a fourth, draining every ready
    socket in one C call at a catch-up, and a fifth doing so through the catch-up the feed binds itself."""
    engines = [Engine(zctx, f"w{i}") for i in range(3)]
    stacks = [Stack(engines, native=True, zmtp=zmtp), Stack(engines, native=False, zmtp=False),
              Stack(engines, native=False, zmtp=True)]
    if zmtp:
        stacks.append(Stack(engines, native=True, zmtp=True, ready=True))
        stacks.append(Stack(engines, native=True, zmtp=True, ready="bound"))
    try:
        for s in stacks:
            await s.start()
        for e in engines:
            await e.subscribed(len(stacks))
        yield engines, stacks
    finally:
        for s in stacks:
            await s.stop()
        for e in engines:
            e.pub.close(0)


@pytest.mark.parametrize("zmtp", [False, True], ids=["libzmq", "zmtp"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OP, min_size=1, max_size=40), end_broken=st.booleans())
async def test_the_c_drain_leaves_what_the_python_loop_leaves(
        zctx: zmq.Context[zmq.Socket[bytes]], zmtp: bool, ops: list[tuple[str, int, int]], end_broken: bool) -> None:
    async with three_stacks(zctx, zmtp) as (engines, stacks):
        for e in engines:  # each worker known to both indexes (the C drain reads for known workers only)
            e.publish("store", 1)
        await await_until(lambda: all(s.feed.batches[e.wid] == 1 for s in stacks for e in engines), 5, "known")
        for s in stacks:
            s.source.catch_up()  # a decision: from now on batches wait for the next (or for a drain below)
        for op, i, k in ops:
            if op == "decide":
                for s in stacks:
                    s.feed.tick()
            elif op == "expect":  # owed a batch until one arrives (the last batches below pay every debt)
                for s in stacks:
                    s.feed.expect_events(engines[i].wid)
            else:
                engines[i].publish(op, k)
        # a last batch from each engine, its ts its seq: a feed that applied it has taken every message before it
        # (equal states alone can come before the last messages reach any feed, on a loaded box)
        marks = {}
        for e in engines:
            marks[e.wid] = float(e.seq)
            e.publish("store", 1)
        if end_broken:
            engines[0].publish("seqlen", 0)

        def settled() -> bool:
            for s in stacks:
                s.feed.tick()
            return all(s.state(engines)["ts"].get(wid) == ts for s in stacks for wid, ts in marks.items())

        await await_until(settled, 5, "every feed at the last batches")
        await asyncio.sleep(0.05)  # anything late (it must not be) would show below
        for s in stacks:
            s.feed.tick()
        for s in stacks[1:]:
            assert s.state(engines) == stacks[0].state(engines)
        assert stacks[1].c_batches == 0 and stacks[2].c_batches == 0


@pytest.mark.parametrize("zmtp", [False, True], ids=["libzmq", "zmtp"])
async def test_batches_in_sequence_are_applied_by_the_c_drain(zctx: zmq.Context[zmq.Socket[bytes]],
                                                              zmtp: bool) -> None:
    """Once the index knows the worker, a decision's catch-up applies queued batches in C, with the same
    result as the Python loops."""
    async with three_stacks(zctx, zmtp) as (engines, stacks):
        engines[1].publish("store", 2)
        await await_until(lambda: all(s.feed.batches["w1"] == 1 for s in stacks), 5, "the first batch")
        for s in stacks:
            s.source.catch_up()
        for op in ["store", "store", "remove", "store", "remove"]:
            engines[1].publish(op, 2)

        def settled() -> bool:
            for s in stacks:
                s.feed.tick()
            return all(s.feed.batches["w1"] == 6 for s in stacks)

        await await_until(settled, 5, "every batch")
        for s in stacks[1:]:
            assert s.state(engines) == stacks[0].state(engines)
        assert stacks[0].c_batches == 5
        assert all(s.c_batches == 5 for s in stacks[3:])


async def test_one_decision_applies_every_batch_queued_on_the_socket_in_c() -> None:
    """Over inproc (a sent message is in the subscriber's pipe when ``send`` returns) a decision's catch-up takes
    every queued batch in one go, in C, in order."""
    source = ZmqEventSource(backstop=60.0)
    await source.start()
    assert source._ctx is not None
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(source._ctx.underlying)
    pub = ctx.socket(zmq.XPUB)
    pub.bind("inproc://drain-w1")
    engine = Engine.__new__(Engine)
    engine.wid, engine.pub, engine.seq, engine.stored, engine.next_hash, engine.last = "w1", pub, 0, [], 1, None
    record = WorkerRecord(instance_id="w1", model=MODEL, http_url="http://w1.invalid",
                          kv_events=KvEventEndpoint(endpoint="inproc://drain-w1", topic="kv-events"))
    index = PrefixIndex(block_size=BLOCK)
    feed = IndexFeed(FakeFleet(record), source, index)
    drained: list[int] = []

    def counted(wid: str, handle: int, expected: int | None) -> Any:
        before = feed.batches[wid]
        got = feed.on_socket(wid, handle, expected)
        drained.append(feed.batches[wid] - before)
        return got

    source.bind(feed.on_batch, feed.on_gap, feed.on_payload, counted)
    await feed.start()
    try:
        await engine.subscribed(1)
        engine.publish("store", 2)
        await await_until(lambda: feed.batches["w1"] == 1, 5, "the first batch (the loop's reader)")
        source.catch_up()  # a decision: batches now wait for the next one
        for op in ["store", "remove", "store", "store", "remove"]:
            engine.publish(op, 2)
        for _ in range(5):
            await asyncio.sleep(0)
        assert feed.batches["w1"] == 1
        drained.clear()
        feed.tick()
        assert feed.batches["w1"] == 6 and drained == [5]
        assert index._workers["w1"].last_event_ts == 5.0
        assert index.block_count("w1") == len(engine.stored)
    finally:
        await feed.stop()
        pub.close(0)
        await source.stop()
