"""KV events over NATS: one subscription to ``infera.kv.events.>`` for the whole fleet.

Each worker's wrapper relays its engine's ZMQ batches there, framed by
:mod:`infera.protocols.nats_wire` with the engine's own sequence numbers. Per watched worker
a task first asks the relay to replay everything since seq 0 (so a router that starts late
still learns the current cache), then follows the live batches in sequence order. A jump in
sequence numbers (NATS core drops messages across a broker restart or for a slow consumer)
is repaired by a replay request to ``infera.kv.replay.<worker>``, which the relay answers
from its engine's replay socket; when that is impossible the gap sink is told, and the
router drops that worker's view rather than trust a view that may miss removals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from infera.protocols import nats_wire as wire
from infera.protocols.kv_events import replay_step, seq_from_bytes, seq_to_bytes
from infera.protocols.worker import WorkerRecord
from infera.transport.base import EventSink, GapSink, RawSink, ReadySink, SocketSink, StreamSink
from infera.transport.delivery import deliver

log = logging.getLogger(__name__)

RECONNECT_WAIT = 0.5


class NatsEventSource:
    def __init__(self, url: str, replay_timeout: float = 1.0, connect_timeout: float = 5.0) -> None:
        self._url = url
        self._replay_timeout = replay_timeout
        self._connect_timeout = connect_timeout
        self._sink: EventSink = lambda worker_id, batch: None
        self._on_gap: GapSink = lambda worker_id, lost: None
        self._raw: RawSink | None = None
        self._nc: Client | None = None
        self._subjects: dict[str, str] = {}  # events subject -> worker id
        self._queues: dict[str, asyncio.Queue[bytes]] = {}  # worker id -> live frames not yet applied
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def bind(self, sink: EventSink, on_gap: GapSink, raw: RawSink | None = None,
             socket: SocketSink | None = None, stream: StreamSink | None = None,
             ready: ReadySink | None = None) -> None:
        self._sink = sink
        self._on_gap = on_gap
        self._raw = raw

    async def start(self) -> None:
        try:
            self._nc = await nats.connect(
                self._url, name="infera-frontend-kv-events", connect_timeout=self._connect_timeout,
                allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=RECONNECT_WAIT,
                error_cb=self._on_error, pending_size=0)
        except (OSError, NatsError) as exc:
            raise OSError(f"cannot reach the NATS broker at {self._url}: {exc}") from exc
        await self._nc.subscribe(wire.KV_EVENTS_ALL, cb=self._on_event, pending_msgs_limit=1 << 20,
                                 pending_bytes_limit=1 << 30)

    async def stop(self) -> None:
        for worker_id in list(self._tasks):
            self.unwatch(worker_id)
        await asyncio.sleep(0)
        if self._nc is not None:
            with contextlib.suppress(NatsError, OSError):
                await self._nc.close()
            self._nc = None

    def catch_up(self) -> None:
        pass  # the NATS client's reader hands over every batch as it arrives

    async def _on_error(self, exc: Exception) -> None:
        log.debug("NATS (KV events): %s", exc)

    def watch(self, worker: WorkerRecord) -> None:
        subject = worker.nats_kv_subject
        if not subject or self._nc is None:
            return
        wid = worker.instance_id
        if self._subjects.get(subject) == wid and wid in self._tasks:
            return
        self.unwatch(wid)
        self._subjects[subject] = wid
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._queues[wid] = queue
        self._tasks[wid] = asyncio.create_task(self._follow(wid, subject, queue), name=f"kv-events-{wid}")

    def unwatch(self, worker_id: str) -> None:
        for subject in [s for s, w in self._subjects.items() if w == worker_id]:
            del self._subjects[subject]
        self._queues.pop(worker_id, None)
        task = self._tasks.pop(worker_id, None)
        if task is not None:
            task.cancel()

    async def _on_event(self, msg: Msg) -> None:
        wid = self._subjects.get(msg.subject)
        queue = self._queues.get(wid) if wid is not None else None
        if queue is not None:
            queue.put_nowait(msg.data)

    async def _follow(self, worker_id: str, subject: str, queue: asyncio.Queue[bytes]) -> None:
        replay = wire.kv_replay_subject(subject)
        try:
            expected = await self._replay(worker_id, replay, 0, None)
            while True:
                frame = await queue.get()
                if len(frame) < 8:
                    log.warning("worker %s: KV-event message of %d bytes ignored", worker_id, len(frame))
                    continue
                seq = seq_from_bytes(frame[:8])
                if expected is not None and seq < expected:
                    continue  # already applied from a replay
                if expected is not None and seq > expected:
                    repaired = await self._replay(worker_id, replay, expected, seq)
                    if repaired is None or repaired < seq:
                        lost = seq - (repaired if repaired is not None else expected)
                        log.warning("worker %s: %d KV-event batches lost (seq %d..%d); its cache view is reset",
                                    worker_id, lost, expected, seq - 1)
                        self._on_gap(worker_id, lost)
                self._deliver(worker_id, frame[8:])
                expected = seq + 1
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker %s: KV-event stream on %s failed", worker_id, subject)

    async def _replay(self, worker_id: str, subject: str, start: int, stop: int | None) -> int | None:
        """Apply batches ``start <= seq < stop`` (all when ``stop`` is None) from the worker's relay.

        Returns the next expected seq, or None when the relay did not answer.
        """
        nc = self._nc
        if nc is None or not nc.is_connected:
            return None
        inbox = nc.new_inbox()
        try:
            sub = await nc.subscribe(inbox)
            await nc.publish(subject, seq_to_bytes(start), reply=inbox)
        except (NatsError, OSError) as exc:
            log.warning("worker %s: cannot ask its KV-event relay for a replay: %s", worker_id, exc)
            return None
        next_seq = start
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=self._replay_timeout)
                except (TimeoutError, NatsError):
                    log.warning("worker %s: its KV-event relay did not answer a replay request", worker_id)
                    return None if next_seq == start else next_seq
                if msg.headers and msg.headers.get("Status") == "503":
                    log.warning("worker %s: no KV-event relay listens on %s", worker_id, subject)
                    return None
                frame = msg.data
                if len(frame) < 8:
                    continue
                seq = seq_from_bytes(frame[:8])
                step = replay_step(seq, next_seq, start, stop)
                if step == "skip":
                    continue
                if step == "done":
                    return next_seq
                if step == "unreachable":
                    return None
                self._deliver(worker_id, frame[8:])
                next_seq = seq + 1
        finally:
            with contextlib.suppress(NatsError, OSError):
                await sub.unsubscribe()

    def _deliver(self, worker_id: str, payload: bytes) -> None:
        deliver(worker_id, payload, self._sink, self._on_gap, self._raw)
