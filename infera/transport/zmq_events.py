"""KV events over ZMQ: one SUB link per worker, straight from the engine's publisher: for a tcp:// publisher infera's
own ZMTP reader on a plain TCP socket (:mod:`infera.transport.zmtp`: no libzmq I/O thread waking per batch), else a
libzmq SUB socket (:mod:`infera.transport.libzmq_link`).

Each worker gets a task that first asks the engine's replay socket for everything since
seq 0 (so a router that starts late still learns the current cache), then follows the
live stream. A jump in sequence numbers is repaired from the replay socket; when that
is impossible the gap sink is told, and the router drops that worker's view rather
than trust a view that may miss removals.

When a batch is applied: the sockets' descriptors sit in a private epoll, not in the event loop's
selector, and every routing decision first applies what is queued (:meth:`ZmqEventSource.catch_up`,
one ``epoll_wait(0)``): a decision sees every batch that reached its socket before it started, and a
batch costs no loop wake-up of its own while decisions come (an engine publishes 1-3 batches a
request, each a wake-up of a process that then runs cold). When no decision has caught up for
``backstop`` seconds the private epoll's descriptor is put in the loop's selector, so an idle frontend
still applies every batch as it arrives, until the next decision (a libzmq SUB's queue is unbounded; a ZMTP
link's is the kernel's socket buffers and the PUB's send high-water mark, read at least every ``backstop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from infera.protocols.kv_events import replay_step, seq_from_bytes, seq_to_bytes
from infera.protocols.worker import WorkerRecord
from infera.transport.base import (
    DRAIN_BROKEN,
    DRAIN_COMMAND,
    DRAIN_DECLINED,
    DRAIN_EMPTY,
    DRAIN_FAILED,
    DRAIN_FRAMES,
    DRAIN_MESSAGE,
    EventSink,
    GapSink,
    RawSink,
    ReadySink,
    SocketSink,
    StreamSink,
    StreamState,
)
from infera.transport.delivery import deliver, failed
from infera.transport.libzmq_link import LibzmqLink
from infera.transport.zmtp import ZmtpLink, tcp_address

log = logging.getLogger(__name__)


def _ignored(worker_id: str, frames: int) -> None:
    """A KV-event message of ``frames`` frames, not 3: skipped, with a warning."""
    log.warning("worker %s: KV-event message with %d frames ignored", worker_id, frames)


BACKSTOP = 0.5
"""Seconds after the last :meth:`ZmqEventSource.catch_up` until batches are applied again as they arrive."""


class ZmqEventSource:
    """KV events over ZMQ (the module's docstring). ``zmtp``: read tcp:// publishers with infera's own ZMTP reader
    (:mod:`infera.transport.zmtp`, no libzmq I/O thread); False: every endpoint through libzmq."""

    def __init__(self, replay_timeout: float = 1.0, backstop: float = BACKSTOP,
                 clock: Callable[[], float] = time.monotonic, zmtp: bool = True) -> None:
        self._sink: EventSink = lambda worker_id, batch: None
        self._on_gap: GapSink = lambda worker_id, lost: None
        self._raw: RawSink | None = None
        self._socket: SocketSink | None = None
        self._stream: StreamSink | None = None
        self._ready_sink: ReadySink | None = None
        self._zmtp = zmtp
        self._replay_timeout = replay_timeout
        self._backstop = backstop
        self._clock = clock
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._endpoints: dict[str, str] = {}
        self._subs: set[LibzmqLink | ZmtpLink] = set()  # the open links
        # the SUB sockets' descriptors -> their readers; the epoll is in the loop's selector while ``_armed``
        self._poller: select.epoll | None = None
        self._readers: dict[int, Callable[[], None]] = {}
        # the ZMTP links the ready sink drains (descriptor -> the link's state) and how each link's reader goes on
        # from what a drain left it
        self._streams: dict[int, StreamState] = {}
        self._resumes: dict[StreamState, Callable[[int, Any], None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed = False
        self._caught_up = 0.0  # the clock's time of the last catch_up
        self._timer: asyncio.TimerHandle | None = None  # the backstop, set while not armed

    def bind(self, sink: EventSink, on_gap: GapSink, raw: RawSink | None = None,
             socket: SocketSink | None = None, stream: StreamSink | None = None,
             ready: ReadySink | None = None) -> None:
        self._sink = sink
        self._on_gap = on_gap
        self._raw = raw
        self._socket = socket
        self._stream = stream
        self._ready_sink = ready

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._loop = asyncio.get_running_loop()
        self._poller = select.epoll()
        self._arm()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for worker_id in list(self._tasks):
            self.unwatch(worker_id)
        if tasks:  # each closes its socket as it ends
            await asyncio.wait(tasks, timeout=1.0)
        for link in list(self._subs):  # the context's end waits for every socket it made, these too
            link.close()
        self._subs.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._poller is not None:
            if self._armed and self._loop is not None:
                self._loop.remove_reader(self._poller.fileno())
            self._armed = False
            self._poller.close()
            self._poller = None
            self._readers.clear()
            self._streams.clear()
            self._resumes.clear()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def catch_up(self) -> None:
        """Apply every batch queued on the sockets now (a decision starts); batches wait on their sockets until
        the next decision, or for ``backstop`` seconds after this one at most."""
        if self._poller is None:
            return
        self._ready()
        self._caught_up = self._clock()
        if self._armed:
            assert self._loop is not None
            self._loop.remove_reader(self._poller.fileno())
            self._armed = False
        if self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(self._backstop, self._due)

    def _ready(self) -> None:
        """Run the reader of every socket whose descriptor signals (O(signalling sockets), one syscall); with ZMTP
        links and a ready sink, one call reads and applies every ready link's batches, and only what it leaves
        (another link's signal, a gap, a command, a lost connection, ...) comes back to the links' readers."""
        assert self._poller is not None
        readers = self._readers
        if self._ready_sink is not None and self._streams:
            try:
                others, left = self._ready_sink(self._poller.fileno(), self._streams)
            except Exception:  # a fault inside the one call (not a socket's: those come back as a lost link)
                # must not fail the decision that caught up: every link's reader runs (the call's epoll_wait took
                # the signals, and a libzmq socket's does not come again), each reading what is left on its link
                log.exception("kv events: the one-call catch-up failed; reading every link by itself")
                for read_link in list(readers.values()):
                    read_link()
                return
            for fd in others:
                reader = readers.get(fd)
                if reader is not None:
                    reader()
            for state, status, extra in left:
                resume = self._resumes.get(state)
                if resume is not None:
                    resume(status, extra)
            return
        for fd, _ in self._poller.poll(0):
            reader = readers.get(fd)
            if reader is not None:
                reader()

    def _due(self) -> None:
        """The backstop: no decision caught up for ``backstop`` seconds, so batches are applied as they arrive."""
        self._timer = None
        if self._poller is None or self._loop is None:
            return
        left = self._caught_up + self._backstop - self._clock()
        if left > 0:
            self._timer = self._loop.call_later(left, self._due)
            return
        self._ready()
        self._arm()

    def _arm(self) -> None:
        if self._poller is not None and self._loop is not None and not self._armed:
            self._loop.add_reader(self._poller.fileno(), self._ready)
            self._armed = True

    def watch(self, worker: WorkerRecord) -> None:
        ev = worker.kv_events
        if ev is None or self._ctx is None:
            return
        if self._endpoints.get(worker.instance_id) == ev.endpoint:
            return
        self.unwatch(worker.instance_id)
        self._endpoints[worker.instance_id] = ev.endpoint
        self._tasks[worker.instance_id] = asyncio.create_task(
            self._follow(worker.instance_id, ev.endpoint, ev.replay_endpoint, ev.topic),
            name=f"kv-events-{worker.instance_id}",
        )

    def unwatch(self, worker_id: str) -> None:
        self._endpoints.pop(worker_id, None)
        task = self._tasks.pop(worker_id, None)
        if task is not None:
            task.cancel()

    def _link(self, endpoint: str, topic: str) -> LibzmqLink | ZmtpLink:
        """The reader of a worker's stream: ZMTP on a plain TCP socket where it can (a tcp:// endpoint, unless the
        source was made with ``zmtp=False``), else a libzmq SUB socket."""
        address = tcp_address(endpoint) if self._zmtp else None
        if address is not None:
            return ZmtpLink(*address, topic.encode(), self._stream)
        assert self._ctx is not None
        return LibzmqLink(self._ctx, endpoint, topic, self._socket)

    async def _follow(self, worker_id: str, endpoint: str, replay: str | None, topic: str) -> None:
        # A plain read in a reader callback (run by a decision's catch_up, or by the loop while armed): the callback
        # itself takes every batch queued at each call and applies the ones in sequence, with no task step, future
        # or coroutine per batch (zmq.asyncio's awaited receive cost ~35 µs of CPU per message against ~12,
        # bench/README.md "Issue 15, fifth round"; the task hop and a coroutine per batch ~1.5 more, "eighth round:
        # the KV-event intake"). The engines publish about one batch per request. This task runs only what must
        # wait: the connection (ZMTP's: libzmq connects on its own), the start-up replay and the repair of a gap,
        # during which the callback leaves the messages queued.
        link = self._link(endpoint, topic)
        self._subs.add(link)
        loop = asyncio.get_running_loop()
        # the callback's state: the next expected seq and whether the task owns the link (busy) in ``state`` (the
        # ready sink reads and sets them too), the message past a gap (the task repairs it), and the future the
        # task waits on
        state = StreamState(worker_id)
        pending: list[bytes] | None = None
        wake: asyncio.Future[None] = loop.create_future()

        def take(frames: list[bytes]) -> bool:
            """One message off the link: apply it in sequence (True), or hand a gap to the task (False)."""
            nonlocal pending
            if len(frames) != 3:
                _ignored(worker_id, len(frames))
                return True
            seq = seq_from_bytes(frames[1])
            expected = state.expected
            if expected is not None:
                if seq < expected:
                    return True  # already applied from a replay
                if seq > expected:
                    pending, state.busy = frames, True
                    if not wake.done():
                        wake.set_result(None)
                    return False
            deliver(worker_id, frames[2], self._sink, self._on_gap, self._raw)
            state.expected = seq + 1
            return True

        def drain(got: tuple[int, Any] | None = None) -> None:
            """Apply every queued batch in sequence; stop at a gap and hand it to the task. ``got``: a drain's
            answer (``DRAIN_*`` code, what goes with it) to go on from (the ready sink's), else the link is read."""
            # The index's C reads the link and applies each payload where it lies, one call for them all
            # (csrc/zmq_drain.c, csrc/zmtp_drain.c); what it leaves (a gap, a payload it does not take, ...) comes
            # back here. It reads nothing for a worker the index does not know yet (None), nor a ZMTP command:
            # one message is read here, then it is asked again (that message may have made the worker known)
            c = link.drain
            read = link.read
            while True:
                if got is None and c is not None:
                    answer = c(worker_id, state.expected)
                    if answer is not None:
                        status, state.expected, extra = answer
                        got = status, extra
                if got is not None:
                    (status, extra), got = got, None
                    if status == DRAIN_EMPTY:
                        return
                    if status == DRAIN_MESSAGE:
                        if not take(extra):
                            return
                    elif status == DRAIN_FAILED:
                        failed(worker_id, extra[1], self._on_gap)
                    elif status == DRAIN_FRAMES:
                        _ignored(worker_id, extra)
                    elif status == DRAIN_BROKEN:
                        raise extra
                    elif status == DRAIN_DECLINED:  # the worker's blocks in other tiers: read here, all of them
                        c = None
                    if status != DRAIN_COMMAND:
                        continue
                frames = read()
                if frames is None:
                    return
                if not take(frames):
                    return

        poller = self._poller
        assert poller is not None
        fd = -1  # the descriptor in the private epoll (-1: none)
        # the ready sink drains the link itself (a ZMTP link whose index takes streams)
        streamed = isinstance(link, ZmtpLink) and link.drain is not None and self._ready_sink is not None

        def readable(got: tuple[int, Any] | None = None) -> None:
            try:
                if state.busy:  # the task owns the link (a replay): take the signal, or the loop calls this each turn
                    link.absorb()
                    return
                drain(got)
            except Exception as exc:  # a lost connection (the task reopens it) or a broken stream (the task ends it)
                state.busy = True
                detach()  # it would signal at every turn until then
                if not wake.done():
                    wake.set_exception(exc)

        def resume(status: int, extra: Any) -> None:
            readable((status, extra))

        def attach() -> None:
            nonlocal fd
            if self._poller is poller:  # still open (stop closes it after the tasks end)
                fd = link.fd
                self._readers[fd] = readable
                if streamed:
                    assert isinstance(link, ZmtpLink)
                    state.buffer = link.buffer  # the link's for as long as it is open (read in place)
                    self._streams[fd] = state
                    self._resumes[state] = resume
                # a stream's peer's end is in the epoll's event, so the one call reads it after the bytes before it
                # and otherwise stops at a short read (csrc/zmtp_drain.c, drain_ready)
                poller.register(fd, select.EPOLLIN | select.EPOLLRDHUP if streamed else select.EPOLLIN)

        def detach() -> None:
            nonlocal fd
            if fd >= 0 and self._poller is poller:
                with contextlib.suppress(OSError):
                    poller.unregister(fd)
                self._readers.pop(fd, None)
                self._streams.pop(fd, None)
                self._resumes.pop(state, None)
            fd = -1

        try:
            await link.open()
            attach()
            if replay:
                state.expected = await self._replay(worker_id, replay, 0, None)
            while True:
                state.busy = False
                try:
                    drain()  # what queued while the task owned the link
                    if not state.busy:
                        await wake  # a gap, or the callback's failure
                except link.lost as exc:  # the peer went away (ZMTP: libzmq reconnects on its own): reconnect
                    state.busy = True
                    log.info("worker %s: KV-event stream from %s lost (%s); reconnecting", worker_id, endpoint, exc)
                    if wake.done():  # the callback's report of it (or of a gap before it): taken
                        wake.exception()
                    detach()
                    await link.open()
                    attach()
                    wake = loop.create_future()
                    continue  # a gap since is repaired at the next batch, as any
                wake = loop.create_future()
                frames, pending = pending, None
                assert frames is not None
                state.expected = await self._take(worker_id, frames, state.expected, replay)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker %s: KV-event stream from %s failed", worker_id, endpoint)
        finally:
            state.busy = True
            detach()
            link.close()
            self._subs.discard(link)

    async def _take(self, worker_id: str, frames: list[bytes], expected: int | None, replay: str | None) -> int | None:
        """Apply one live message (repairing a gap before it); returns the next expected seq."""
        if len(frames) != 3:
            log.warning("worker %s: KV-event message with %d frames ignored", worker_id, len(frames))
            return expected
        seq = seq_from_bytes(frames[1])
        if expected is not None and seq < expected:
            return expected  # already applied from a replay
        if expected is not None and seq > expected:
            repaired = await self._replay(worker_id, replay, expected, seq) if replay else None
            if repaired is None or repaired < seq:
                lost = seq - (repaired if repaired is not None else expected)
                log.warning("worker %s: %d KV-event batches lost (seq %d..%d); its cache view is reset",
                            worker_id, lost, expected, seq - 1)
                self._on_gap(worker_id, lost)
        self._deliver(worker_id, frames[2])
        return seq + 1

    async def _replay(self, worker_id: str, replay: str | None, start: int, stop: int | None) -> int | None:
        """Apply batches ``start <= seq < stop`` (all when ``stop`` is None) from the replay socket.

        Returns the next expected seq, or None when the replay socket did not answer.
        """
        assert self._ctx is not None and replay is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(replay)
        next_seq = start
        try:
            await dealer.send_multipart([b"", seq_to_bytes(start)])
            while True:
                if not await dealer.poll(int(self._replay_timeout * 1000)):
                    log.warning("worker %s: replay socket %s did not answer", worker_id, replay)
                    return None if next_seq == start else next_seq
                frames = await dealer.recv_multipart()
                if len(frames) != 4:
                    continue
                seq = seq_from_bytes(frames[2])
                step = replay_step(seq, next_seq, start, stop)
                if step == "skip":
                    continue
                if step == "done":
                    return next_seq
                if step == "unreachable":
                    return None
                self._deliver(worker_id, frames[3])
                next_seq = seq + 1
        finally:
            dealer.close(linger=0)

    def _deliver(self, worker_id: str, payload: bytes) -> None:
        deliver(worker_id, payload, self._sink, self._on_gap, self._raw)
