"""KV events over ZMQ exactly as vLLM 0.32 publishes them, plus its replay socket.

Live: a PUB socket sends ``[topic, seq (8 bytes, big-endian), payload]`` where ``payload`` is
one msgpack ``EventBatch``; ``seq`` starts at 0 and grows by one per batch for the life of the
process. Replay: a ROUTER socket takes ``[identity, b"", start_seq]`` (a DEALER sends
``[b"", seq8]``) and answers, for every buffered batch with ``seq >= start_seq``,
``[identity, b"", topic, seq8, payload]``, then the end marker ``[identity, b"", b"", b"\\xff"*8, b""]``.
Both sockets bind on tcp; port 0 picks a free port, advertised through :attr:`endpoint`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time

import zmq
import zmq.asyncio

from infera.protocols.kv_events import REPLAY_END_SEQ, EventBatch, KvEvent, encode_batch, seq_to_bytes

log = logging.getLogger(__name__)

BUFFER_STEPS = 10000  # vLLM's default replay buffer
HWM = 100000


def _bind(sock: zmq.asyncio.Socket, host: str, port: int) -> int:
    if port:
        sock.bind(f"tcp://{host}:{port}")
        return port
    return int(sock.bind_to_random_port(f"tcp://{host}"))


class KvEventPublisher:
    def __init__(self, bind_host: str, advertise_host: str, topic: str, *, port: int = 0, replay_port: int = 0,
                 dp_rank: int = 0) -> None:
        self.topic = topic.encode()
        self.dp_rank = dp_rank
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, HWM)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        pub_port = _bind(self._pub, bind_host, port)
        router_port = _bind(self._router, bind_host, replay_port)
        self.endpoint = f"tcp://{advertise_host}:{pub_port}"
        self.replay_endpoint = f"tcp://{advertise_host}:{router_port}"
        self._seq = 0
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=BUFFER_STEPS)
        self._task: asyncio.Task[None] | None = None
        self._held: list[tuple[bytes, bytes, bytes]] | None = None  # a stalled publisher's unsent batches

    @property
    def next_seq(self) -> int:
        return self._seq

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._serve_replay(), name="kv-replay")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(0)
        self._router.close(0)
        self._ctx.term()

    def publish(self, events: list[KvEvent]) -> None:
        """Send one batch (one engine step's events, in order); never blocks (PUB drops at HWM)."""
        payload = encode_batch(EventBatch(ts=time.time(), events=events, data_parallel_rank=self.dp_rank))
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        frames = (self.topic, seq_to_bytes(seq), payload)
        if self._held is not None:
            self._held.append(frames)
            return
        self._send(frames, seq)

    def hold(self, held: bool) -> None:
        """Stall (True) or resume (False) the live socket; a resume sends what was held, in order."""
        if held:
            if self._held is None:
                self._held = []
            return
        pending, self._held = self._held or [], None
        for frames in pending:
            self._send(frames, int.from_bytes(frames[1], "big"))

    def _send(self, frames: tuple[bytes, bytes, bytes], seq: int) -> None:
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)
        except zmq.Again:
            log.warning("KV-event PUB queue full; dropped seq %d (replay still has it)", seq)

    async def _serve_replay(self) -> None:
        end = (b"", b"", seq_to_bytes(REPLAY_END_SEQ), b"")
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                log.warning("invalid replay request with %d frames; ignored", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._router.send_multipart((identity, b"", self.topic, seq_to_bytes(seq), payload))
            await self._router.send_multipart((identity, *end))
