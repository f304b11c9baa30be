"""ZmqEventSource against real ZMQ sockets replaying the golden vLLM trace, read through libzmq and through the ZMTP
reader (each test runs with both)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from harness import await_until
from infera.protocols.kv_events import REPLAY_END_SEQ, EventBatch, decode_batch, seq_from_bytes, seq_to_bytes
from infera.protocols.worker import KvEventEndpoint, WorkerRecord
from infera.transport.zmq_events import ZmqEventSource
from infera.transport.zmtp import ZmtpLink

pytestmark = pytest.mark.parametrize("zmtp", [False, True], ids=["libzmq", "zmtp"])


def golden_frames(golden_dir: Path) -> list[list[bytes]]:
    lines = (golden_dir / "frames.jsonl").read_text().splitlines()
    return [[base64.b64decode(f) for f in json.loads(line)["frames_b64"]] for line in lines]


class Publisher:
    """A vLLM-like publisher: PUB for live batches (an XPUB, so the test sees a subscription arrive),
    ROUTER that replays from a seq."""

    def __init__(self, ctx: zmq.asyncio.Context, frames: list[list[bytes]], port: int | None = None) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if port is None:
            self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        else:  # a free port, chosen before the publisher exists (it binds after the subscriber connects)
            self.pub.bind(f"tcp://127.0.0.1:{port}")
            self.port = port
        self.router = ctx.socket(zmq.ROUTER)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.frames = frames
        self.replays: list[int] = []
        self.task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            ident, _, start = await self.router.recv_multipart()
            first = seq_from_bytes(start)
            self.replays.append(first)
            for topic, seq, payload in self.frames:
                if seq_from_bytes(seq) >= first:
                    await self.router.send_multipart([ident, b"", topic, seq, payload])
            await self.router.send_multipart([ident, b"", b"", seq_to_bytes(REPLAY_END_SEQ), b""])

    async def subscribed(self) -> None:
        """Return once a subscriber's subscription has reached this socket (live traffic then flows)."""
        while (await asyncio.wait_for(self.pub.recv(), 5.0))[:1] != b"\x01":
            pass

    def record(self, replay: bool = True) -> WorkerRecord:
        return WorkerRecord(
            instance_id="w1", model="smol", http_url="http://127.0.0.1:1", kv_block_size=128,
            kv_events=KvEventEndpoint(endpoint=f"tcp://127.0.0.1:{self.port}",
                                      replay_endpoint=f"tcp://127.0.0.1:{self.replay_port}" if replay else None,
                                      topic="kv-events"))

    def close(self) -> None:
        self.task.cancel()
        self.pub.close(0)
        self.router.close(0)


@contextlib.asynccontextmanager
async def following(zmtp: bool, frames: list[list[bytes]] | None = None) -> AsyncIterator[
        tuple[Publisher, ZmqEventSource, list[EventBatch], list[int]]]:
    """A publisher holding ``frames`` (for replay) and a started source bound to it (reading it over ZMTP if
    ``zmtp``, else libzmq): (publisher, source, the batches it delivered, the gaps it reported); both stopped
    afterwards."""
    ctx = zmq.asyncio.Context()
    pub = Publisher(ctx, frames or [])
    got: list[EventBatch] = []
    gaps: list[int] = []
    source = ZmqEventSource(zmtp=zmtp)
    source.bind(lambda w, b: got.append(b), lambda w, n: gaps.append(n))
    await source.start()
    try:
        yield pub, source, got, gaps
    finally:
        await source.stop()
        pub.close()
        ctx.destroy(0)


async def test_late_subscriber_catches_up_by_replay_then_repairs_a_gap(golden_dir: Path, zmtp: bool) -> None:
    frames = golden_frames(golden_dir)
    async with following(zmtp, frames[:6]) as (pub, source, got, gaps):  # the engine has already published seq 0..5
        source.watch(pub.record())
        await await_until(lambda: len(got) == 6, 5, "the replayed batches")  # everything so far, from replay
        assert pub.replays == [0]
        await pub.subscribed()  # the SUB's subscription reached the publisher: live traffic flows
        pub.frames = frames  # the engine goes on; its buffer holds everything
        await pub.pub.send_multipart(frames[6])
        await pub.pub.send_multipart(frames[9])  # seq 7 and 8 never arrive live
        await await_until(lambda: len(got) == 10, 5, "the live batches and the repaired gap")
        assert pub.replays == [0, 7]
        assert gaps == []
        expected = [decode_batch(f[2]) for f in frames[:10]]
        assert got == expected


async def test_a_queued_burst_with_a_gap_inside_arrives_whole_and_in_order(golden_dir: Path, zmtp: bool) -> None:
    """Batches queued on the socket are taken in one wake-up; a gap among them is still repaired
    from the replay socket before the batch after it."""
    frames = golden_frames(golden_dir)
    assert len(frames) >= 10
    async with following(zmtp) as (pub, source, got, gaps):
        source.watch(pub.record())
        await pub.subscribed()
        await await_until(lambda: pub.replays == [0], 5, "the start-up replay (of nothing)")
        pub.frames = frames
        for i, frame in enumerate(frames[:10]):  # no await yields here: the subscriber finds them queued
            if i not in (4, 5):
                pub.pub.send_multipart(frame)
        await await_until(lambda: len(got) == 10, 5, "the burst and the repaired gap")
        assert got == [decode_batch(f[2]) for f in frames[:10]]
        assert gaps == []


async def test_unrepairable_gap_is_reported(golden_dir: Path, zmtp: bool) -> None:
    frames = golden_frames(golden_dir)
    async with following(zmtp) as (pub, source, got, gaps):
        source.watch(pub.record(replay=False))
        await pub.subscribed()
        await pub.pub.send_multipart(frames[0])
        await pub.pub.send_multipart(frames[3])
        await await_until(lambda: len(got) == 2, 5, "two live batches")
        assert gaps == [2]


async def test_a_batch_the_router_cannot_apply_resets_the_view_and_the_stream_goes_on(golden_dir: Path,
                                                                                     zmtp: bool) -> None:
    """A batch whose apply raises (say a token id the block hashing refuses) is dropped and counted as
    one lost batch (the worker's cache view is reset); the batches after it still arrive."""
    frames = golden_frames(golden_dir)
    ctx = zmq.asyncio.Context()
    pub = Publisher(ctx, [])
    got: list[EventBatch] = []
    gaps: list[int] = []

    def sink(worker_id: str, batch: EventBatch) -> None:
        if not got and not gaps:
            raise OverflowError("int too big to convert")
        got.append(batch)

    source = ZmqEventSource(zmtp=zmtp)
    source.bind(sink, lambda w, n: gaps.append(n))
    await source.start()
    try:
        source.watch(pub.record(replay=False))
        await pub.subscribed()
        for frame in frames[:3]:
            await pub.pub.send_multipart(frame)
        await await_until(lambda: len(got) == 2, 5, "the two batches after the one that failed")
        assert gaps == [1]
        assert got == [decode_batch(f[2]) for f in frames[1:3]]
    finally:
        await source.stop()
        pub.close()
        ctx.destroy(0)


async def test_batches_one_at_a_time_each_arrive_while_the_stream_idles_between_them(golden_dir: Path,
                                                                                    zmtp: bool) -> None:
    """The live case: about one batch per request, the subscriber idle in between. Every batch must wake it
    (its socket's descriptor signals changes, not a level), in order."""
    frames = golden_frames(golden_dir)
    async with following(zmtp) as (pub, source, got, _):
        source.watch(pub.record(replay=False))
        await pub.subscribed()
        for round_ in range(3):  # the same trace again under new seqs: 3 x len(frames) batches, one by one
            for i, (topic, _, payload) in enumerate(frames):
                n = round_ * len(frames) + i
                await pub.pub.send_multipart([topic, seq_to_bytes(n), payload])
                await await_until(lambda n=n: len(got) == n + 1, 5, f"batch {n}")  # type: ignore[misc]
        assert got == [decode_batch(f[2]) for f in frames] * 3


async def test_after_a_repaired_gap_live_batches_flow_again_one_at_a_time(golden_dir: Path, zmtp: bool) -> None:
    """The repair runs in the follow task; once it is done the live stream goes on, each later batch
    applied in order as it arrives (the reader takes the socket back)."""
    frames = golden_frames(golden_dir)
    assert len(frames) >= 10
    async with following(zmtp) as (pub, source, got, gaps):
        source.watch(pub.record())
        await pub.subscribed()
        await await_until(lambda: pub.replays == [0], 5, "the start-up replay (of nothing)")
        pub.frames = frames
        await pub.pub.send_multipart(frames[0])
        await pub.pub.send_multipart(frames[2])  # seq 1 is repaired from the replay socket
        await await_until(lambda: len(got) == 3, 5, "the repaired gap")
        assert pub.replays == [0, 1]
        for n in range(3, 10):
            await pub.pub.send_multipart(frames[n])
            await await_until(lambda n=n: len(got) == n + 1, 5, f"batch {n}")  # type: ignore[misc]
        assert got == [decode_batch(f[2]) for f in frames[:10]]
        assert gaps == [] and pub.replays == [0, 1]


async def test_a_broken_sequence_frame_ends_the_stream_and_stop_still_works(golden_dir: Path, zmtp: bool) -> None:
    """A message whose seq frame is not 8 bytes is a broken stream: it is logged and the worker's stream ends
    (its socket closed), as before; the batches before it were applied, and stopping the source is clean."""
    frames = golden_frames(golden_dir)
    async with following(zmtp) as (pub, source, got, _):
        source.watch(pub.record(replay=False))
        await pub.subscribed()
        await pub.pub.send_multipart(frames[0])
        await pub.pub.send_multipart([frames[1][0], b"\x00\x01", frames[1][2]])
        task = source._tasks["w1"]
        await await_until(task.done, 5, "the stream's end")
        assert not task.cancelled() and task.exception() is None  # ended by its own handler, logged
        assert got == [decode_batch(frames[0][2])]
        assert not source._subs  # its socket is closed


async def test_tcp_is_read_over_zmtp_when_on_and_unwatch_closes_the_connection(golden_dir: Path, zmtp: bool) -> None:
    """The link is the ZMTP reader for a tcp:// endpoint (libzmq's SUB when switched off); unwatching ends the
    stream, closes its socket (the publisher sees the subscription go) and no reader is left."""
    async with following(zmtp) as (pub, source, got, _):
        source.watch(pub.record(replay=False))
        await pub.subscribed()
        (link,) = source._subs
        assert isinstance(link, ZmtpLink) == zmtp
        await pub.pub.send_multipart(golden_frames(golden_dir)[0])
        await await_until(lambda: len(got) == 1, 5, "a batch")
        task = source._tasks["w1"]
        source.unwatch("w1")
        await await_until(task.done, 5, "the stream's end")
        assert not source._subs and not source._readers
        assert await asyncio.wait_for(pub.pub.recv(), 5) == b"\x00kv-events"  # the connection went


async def test_a_publisher_bound_after_the_subscriber_connects_is_followed(golden_dir: Path, zmtp: bool) -> None:
    """The engine binds its PUB after the router watches it: connection attempts fail until then (libzmq
    retries, and so does the ZMTP reader, every 100 ms), then batches flow."""
    frames = golden_frames(golden_dir)
    with socket.socket() as probe:  # a free port, nothing bound on it now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctx = zmq.asyncio.Context()
    got: list[EventBatch] = []
    source = ZmqEventSource(zmtp=zmtp)
    source.bind(lambda w, b: got.append(b), lambda w, n: None)
    await source.start()
    pub: Publisher | None = None
    try:
        source.watch(WorkerRecord(instance_id="w1", model="smol", http_url="http://127.0.0.1:1", kv_block_size=128,
                                  kv_events=KvEventEndpoint(endpoint=f"tcp://127.0.0.1:{port}", topic="kv-events")))
        await asyncio.sleep(0.35)  # refused attempts (nothing to wait on: nothing listens yet)
        pub = Publisher(ctx, [], port=port)
        await pub.subscribed()
        for frame in frames[:3]:
            await pub.pub.send_multipart(frame)
        await await_until(lambda: len(got) == 3, 5, "the batches")
        assert got == [decode_batch(f[2]) for f in frames[:3]]
    finally:
        await source.stop()
        if pub is not None:
            pub.close()
        ctx.destroy(0)


def rebind(sock: zmq.asyncio.Socket, port: int) -> bool:
    """Bind ``sock`` to ``port``: False while the closed publisher's I/O thread still holds it."""
    try:
        sock.bind(f"tcp://127.0.0.1:{port}")
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise
        return False
    return True


async def test_a_restarted_publisher_is_reconnected_and_the_gap_repaired_from_replay(golden_dir: Path,
                                                                                      zmtp: bool) -> None:
    """The engine's PUB goes away and comes back on the same port (its replay socket kept its buffer): the
    subscriber reconnects, and the batches published while it was away are repaired from the replay socket
    when the next live one shows the gap."""
    frames = golden_frames(golden_dir)
    async with following(zmtp, frames[:1]) as (pub, source, got, gaps):
        source.watch(pub.record())
        await await_until(lambda: len(got) == 1, 5, "the replayed batch")
        await pub.subscribed()
        pub.pub.close(0)  # the engine restarts its publisher; seq 1..2 are published while no one listens
        pub.frames = frames
        pub.pub = pub.pub.context.socket(zmq.XPUB)
        pub.pub.setsockopt(zmq.LINGER, 0)
        await await_until(lambda: rebind(pub.pub, pub.port), 5, "the port free again")  # libzmq closes it later
        await pub.subscribed()  # reconnected
        await pub.pub.send_multipart(frames[3])
        await await_until(lambda: len(got) == 4, 5, "the live batch and the repaired gap")
        assert got == [decode_batch(f[2]) for f in frames[:4]]
        assert gaps == [] and pub.replays == [0, 1]


async def test_a_message_of_two_frames_is_warned_about_and_skipped(golden_dir: Path, zmtp: bool,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    frames = golden_frames(golden_dir)
    caplog.set_level(logging.WARNING, "infera.transport.zmq_events")
    async with following(zmtp) as (pub, source, got, gaps):
        source.watch(pub.record(replay=False))
        await pub.subscribed()
        await pub.pub.send_multipart(frames[0][:2])
        await pub.pub.send_multipart(frames[0])
        await await_until(lambda: len(got) == 1, 5, "the batch after it")
        assert got == [decode_batch(frames[0][2])] and gaps == []
        assert "KV-event message with 2 frames ignored" in caplog.text
