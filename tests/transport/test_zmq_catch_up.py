"""KV events over real ZMQ applied at a routing decision, not at a loop wake-up of their own.

The ZMQ source keeps its sockets out of the loop's selector while decisions come: a decision
(``IndexFeed.tick`` -> ``ZmqEventSource.catch_up``) applies what reached the sockets, and only when no
decision came for ``backstop`` seconds are batches applied as they arrive again (an idle frontend).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import select
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import await_until
from infera.discovery.base import FleetChange
from infera.kv.feed import IndexFeed
from infera.kv.index import PrefixIndex
from infera.kv.tokenizer import PromptRenderer
from infera.protocols.kv_events import BlockStored, EventBatch, encode_batch, seq_to_bytes
from infera.protocols.worker import KvEventEndpoint, WorkerRecord
from infera.router.router import Router, RouterOptions
from infera.transport.zmq_events import ZmqEventSource
from tests.fakes import MODEL, FakeFleet, FakeTransport, chat_request

TOPIC = b"kv-events"


class Engine:
    """One worker's publisher (an XPUB, so a test sees the subscription arrive), driven synchronously."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], wid: str) -> None:
        self.wid = wid
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0

    def record(self) -> WorkerRecord:
        return WorkerRecord(instance_id=self.wid, model=MODEL, http_url=f"http://{self.wid}.invalid",
                            kv_events=KvEventEndpoint(endpoint=f"tcp://127.0.0.1:{self.port}", topic="kv-events"))

    async def subscribed(self) -> None:
        deadline = time.monotonic() + 5
        while not self.pub.poll(0):
            assert time.monotonic() < deadline, "no subscription"
            await asyncio.sleep(0.005)
        assert self.pub.recv()[:1] == b"\x01"

    def publish(self, batch: EventBatch) -> None:
        self.pub.send_multipart([TOPIC, seq_to_bytes(self.seq), encode_batch(batch)])
        self.seq += 1


def stored(tokens: list[int], first_hash: int, block: int = 16) -> EventBatch:
    n = len(tokens) // block
    return EventBatch(ts=0.0, events=[BlockStored(block_hashes=list(range(first_hash, first_hash + n)),
                                                  parent_block_hash=None, token_ids=tokens[:n * block],
                                                  block_size=block)])


def wait_readable(fd: int) -> None:
    """Block (the loop does not run) until ``fd`` signals: a message reached the socket behind it."""
    ready, _, _ = select.select([fd], [], [], 5.0)
    assert ready, "the batch did not reach the socket"


def sub_fd(source: ZmqEventSource, known: set[int]) -> int:
    (fd,) = set(source._readers) - known
    return fd


@pytest.fixture
def renderer(tiny_tokenizer_dir: Path) -> PromptRenderer:
    return PromptRenderer.from_dir(str(tiny_tokenizer_dir))


@pytest.fixture
async def zctx() -> AsyncIterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(0)


@contextlib.asynccontextmanager
async def two_workers(renderer: PromptRenderer, zctx: zmq.Context[zmq.Socket[bytes]]
                      ) -> AsyncIterator[tuple[list[Engine], ZmqEventSource, Router]]:
    """Engines a and b publishing over real ZMQ to a kv-aware router's source, their first batches applied and one
    decision made (from then on no wake-up per batch: the next decision catches up)."""
    engines = [Engine(zctx, "a"), Engine(zctx, "b")]
    source = ZmqEventSource(backstop=60.0)
    router = Router(FakeFleet(*(e.record() for e in engines)), FakeTransport(), source, renderer,
                    RouterOptions(policy="kv-aware"), rng=random.Random(7))
    await source.start()
    await router.start()
    try:
        for e in engines:
            await e.subscribed()
        await await_until(lambda: len(source._readers) == 2, 5, "both sockets")
        for e in engines:  # one batch each through the loop (the source starts armed): the streams flow
            e.publish(stored(list(range(1000, 1032)), 10**6 * ord(e.wid)))
        await await_until(lambda: all(router._feed.batches[e.wid] == 1 for e in engines), 5, "the first batches")
        router.place_now(chat_request("another prompt")).release()  # a decision: from now on no wake-up per batch
        assert not source._armed
        yield engines, source, router
    finally:
        await router.stop()
        await source.stop()
        for e in engines:
            e.pub.close(0)


def publish_and_wait(engine: Engine, source: ZmqEventSource, tokens: list[int]) -> None:
    """``engine`` publishes the blocks of ``tokens``; returns once the batch reached the source's socket."""
    engine.publish(stored(tokens, 1))
    assert source._poller is not None
    wait_readable(source._poller.fileno())


async def test_a_decision_sees_the_batch_that_reached_the_socket_before_it(
        renderer: PromptRenderer, zctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """Publish a batch with real ZMQ, and without letting the loop run, route a request whose prefix only that
    batch names: it lands on that worker, with the whole prompt cached there."""
    async with two_workers(renderer, zctx) as (engines, source, router):
        req = chat_request("the prompt only b's batch names " * 12)
        tokens = router.tokens("chat", req.payload)
        assert len(tokens) >= 64
        picked = router.preview(MODEL, tokens)  # without b's batch, nothing is cached: the tie's worker
        assert picked is not None and picked.instance_id == "a"
        publish_and_wait(engines[1], source, tokens)
        placement = router.place_now(req)  # no await since the publish: only the decision can have applied it
        assert placement.worker.instance_id == "b"
        assert placement.overlap == len(tokens) // 16
        assert router._feed.batches["b"] == 2
        placement.release()


class Fed:
    """A started source over ``n`` engines, recording what it delivers (worker, seq of the engine's batch).

    ``native``: the source feeds an index whose C drains each socket (``PrefixIndex.drain_socket``, after a
    worker's first batch), and what it delivered is read from the feed's batch count and the index's last ts."""

    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], n: int, backstop: float, native: bool = False) -> None:
        self.engines = [Engine(zctx, f"w{i}") for i in range(n)]
        self.source = ZmqEventSource(backstop=backstop)
        self.got: list[tuple[str, float]] = []
        self.feed: IndexFeed | None = None
        if native:
            index = PrefixIndex()
            assert index.takes_sockets
            self.feed = IndexFeed(FakeFleet(*(e.record() for e in self.engines)), self.source, index)
        else:
            self.source.bind(lambda w, b: self.got.append((w, b.ts)), lambda w, n: None)
        self.fds: dict[str, int] = {}

    async def start(self) -> None:
        await self.source.start()
        for e in self.engines:
            known = set(self.source._readers)
            if self.feed is None:
                self.source.watch(e.record())
            else:
                self.feed._on_change(FleetChange("add", e.record()))
            await await_until(lambda n=len(known): len(self.source._readers) > n, 5, "the socket")  # type: ignore[misc]
            self.fds[e.wid] = sub_fd(self.source, known)
            await e.subscribed()

    def publish(self, i: int) -> None:
        e = self.engines[i]
        if self.feed is None:
            e.publish(EventBatch(ts=float(e.seq), events=[]))
        else:  # a block the C applies (an empty batch too, but this one shows in the index)
            block = 10**6 * (i + 1) + e.seq
            e.publish(EventBatch(ts=float(e.seq), events=[BlockStored(
                block_hashes=[block], parent_block_hash=None, token_ids=list(range(block % 1000, block % 1000 + 16)),
                block_size=16)]))

    def delivered(self, wid: str) -> list[float]:
        if self.feed is None:
            return [ts for w, ts in self.got if w == wid]
        n = self.feed.batches[wid]
        if n:  # in order: the last applied is the n-th published
            assert self.feed.index._workers[wid].last_event_ts == float(n - 1)
            assert self.feed.index.block_count(wid) == n
        return [float(s) for s in range(n)]

    async def stop(self) -> None:
        await self.source.stop()
        for e in self.engines:
            e.pub.close(0)


@pytest.mark.parametrize("native", [False, True], ids=["python", "c-drain"])
async def test_while_decisions_come_a_batch_waits_for_the_next_one(zctx: zmq.Context[zmq.Socket[bytes]],
                                                                    native: bool) -> None:
    """After a decision the loop is not woken by a batch (it stays queued however many turns the loop runs);
    the next decision applies it (a second batch: the C drain's, once the index knows the worker)."""
    fed = Fed(zctx, 1, backstop=60.0, native=native)
    await fed.start()
    try:
        fed.publish(0)
        await await_until(lambda: len(fed.delivered("w0")) == 1, 5, "the first batch (armed at the start)")
        for n in (2, 3):
            fed.source.catch_up()
            fed.publish(0)
            wait_readable(fed.fds["w0"])
            for _ in range(20):
                await asyncio.sleep(0)
            assert fed.delivered("w0") == [float(s) for s in range(n - 1)]
            fed.source.catch_up()
            assert fed.delivered("w0") == [float(s) for s in range(n)]
    finally:
        await fed.stop()


@pytest.mark.parametrize("native", [False, True], ids=["python", "c-drain"])
async def test_with_no_decision_for_the_backstop_an_idle_frontend_applies_batches_as_they_arrive(
        zctx: zmq.Context[zmq.Socket[bytes]], native: bool) -> None:
    fed = Fed(zctx, 2, backstop=0.05, native=native)
    await fed.start()
    try:
        def count() -> int:
            return sum(len(fed.delivered(e.wid)) for e in fed.engines)

        fed.source.catch_up()  # a decision, then none
        fed.publish(0)
        fed.publish(1)
        await await_until(lambda: count() == 2, 5, "both batches, applied by the backstop")
        await await_until(lambda: fed.source._armed, 5, "the loop's reader armed again")
        fed.publish(1)  # and from now on as each arrives
        await await_until(lambda: count() == 3, 5, "the batch after the backstop")
        assert fed.delivered("w0") == [0.0] and fed.delivered("w1") == [0.0, 1.0]
    finally:
        await fed.stop()


OPS = st.lists(st.one_of(st.tuples(st.just("publish"), st.integers(0, 2)), st.just(("decide", 0)),
                         st.just(("turn", 0))), max_size=30)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, backstop=st.sampled_from([0.0, 0.02, 60.0]), native=st.booleans())
async def test_any_interleaving_delivers_every_batch_once_in_order_and_a_decision_misses_none(
        zctx: zmq.Context[zmq.Socket[bytes]], ops: list[tuple[str, int]], backstop: float, native: bool) -> None:
    """Batches published, decisions and loop turns in any order: each worker's batches are delivered exactly
    once, in order, as a loop reader per socket delivered them; and a decision misses no batch that reached
    its socket before it (checked where that is observable: one batch in flight, its socket signalling); through
    the pyzmq loop or the index's C drain."""
    fed = Fed(zctx, 3, backstop, native=native)
    await fed.start()
    try:
        for op, i in ops:
            if op == "publish":
                fed.publish(i)
            elif op == "turn":
                await asyncio.sleep(0)
            else:
                checked = []
                for e in fed.engines:
                    if e.seq - len(fed.delivered(e.wid)) == 1:  # one batch in flight: wait until it is there
                        wait_readable(fed.fds[e.wid])
                        checked.append(e)
                fed.source.catch_up()
                for e in checked:
                    assert fed.delivered(e.wid) == [float(s) for s in range(e.seq)]
        def all_there() -> bool:  # decisions go on until every batch is in (or the backstop applies them)
            fed.source.catch_up()
            return all(len(fed.delivered(e.wid)) == e.seq for e in fed.engines)

        await await_until(all_there, 5, "every batch")
        for e in fed.engines:
            assert fed.delivered(e.wid) == [float(s) for s in range(e.seq)]
    finally:
        await fed.stop()


async def test_a_batch_queued_on_its_socket_is_applied_before_the_feed_calls_a_worker_silent(
        zctx: zmq.Context[zmq.Socket[bytes]], caplog: pytest.LogCaptureFixture) -> None:
    """Blindness stays right: a worker's batch that reached its socket but waits for a decision (none came)
    ends its owed events before the feed's tick judges the silence, by a fake clock well past the limit."""
    caplog.set_level(logging.WARNING, logger="infera.kv.feed")
    now = [0.0]
    engine = Engine(zctx, "w0")
    source = ZmqEventSource(backstop=60.0)
    feed = IndexFeed(FakeFleet(engine.record()), source, PrefixIndex(), stale_seconds=1.0, clock=lambda: now[0])
    await source.start()
    await feed.start()
    try:
        await engine.subscribed()
        # the PUB has the subscription before the reader's task resumes to put the socket in the epoll
        await await_until(lambda: len(source._readers) == 1, 5, "the socket in the source's epoll")
        source.catch_up()  # a decision: batches now wait for the next one
        feed.expect_events("w0", sent_at=0.0)
        now[0] = 0.5
        engine.publish(stored(list(range(64)), 1))
        wait_readable(next(iter(source._readers)))
        now[0] = 10.0  # the batch has waited past the limit; the next tick (timer or decision) sees it first
        feed.tick()
        assert not feed.blind("w0") and not feed.events_stale("w0")
        assert feed.batches["w0"] == 1 and "no KV events" not in caplog.text
        # and a real silence is still logged
        feed.expect_events("w0", sent_at=10.0)
        now[0] = 20.0
        feed.tick()
        assert feed.blind("w0") and "no KV events" in caplog.text
    finally:
        await feed.stop()
        await source.stop()
        engine.pub.close(0)


async def test_a_fault_in_the_one_call_catch_up_fails_no_decision_and_the_links_readers_apply_the_batch(
        renderer: PromptRenderer, zctx: zmq.Context[zmq.Socket[bytes]], caplog: pytest.LogCaptureFixture) -> None:
    """The one C call that reads every ready ZMTP link raises (a bug's TypeError, a MemoryError): the decision that
    caught up still places its request, on the worker whose batch reached the socket, applied by that link's own
    reader, and the fault is logged."""
    async with two_workers(renderer, zctx) as (engines, source, router):
        assert source._streams, "the links are ZMTP links read by the one call"

        def broken(epfd: int, streams: object) -> tuple[list[int], list[object]]:
            raise TypeError("a fault inside the one call")

        source._ready_sink = broken
        req = chat_request("the prompt only b's batch names " * 12)
        tokens = router.tokens("chat", req.payload)
        publish_and_wait(engines[1], source, tokens)
        with caplog.at_level(logging.ERROR, logger="infera.transport.zmq_events"):
            placement = router.place_now(req)
        assert placement.worker.instance_id == "b"
        assert placement.overlap == len(tokens) // 16
        assert router._feed.batches["b"] == 2
        assert "one-call catch-up failed" in caplog.text
        placement.release()
