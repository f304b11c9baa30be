"""The index feed: fleet changes -> KV-event subscriptions -> batches into the prefix index.

It watches every worker that joins (the event source subscribes to its KV events), feeds
each decoded batch into the :class:`PrefixIndex`, drops a worker's view when batches were
lost for good (the view may miss removals), and forgets everything about a worker that
leaves. It also knows when the router is **blind** to a worker's cache: the worker
publishes no events, the router follows none, or the worker served an uncached prompt
more than ``stale_seconds`` ago and no batch has arrived since it was sent there (its events
stopped). A batch that arrived between the dispatch and the first byte counts: an engine
publishes the prompt's blocks at the start of the step that computes them, so they often
arrive before the first token does.

:meth:`IndexFeed.blind` is a pure query (metrics scrape it). The log line that says a
worker went blind, or that its events flow again, is written by :meth:`IndexFeed.tick`,
which runs on every decision and, while the feed is started, on a timer set for the moment
the first owed batch is ``stale_seconds`` late (none is set while no batch is owed: an idle
frontend's loop is not woken for it), and by the batch that ends the blindness. A tick first has
the event source apply what reached it and waits (the ZMQ source leaves batches queued on its
sockets while decisions come, :meth:`KvEventSource.catch_up`), so a silence is never logged for a
batch that is there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from infera.discovery.base import FleetChange, FleetView
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import EventBatch
from infera.transport.base import KvEventSource, StreamState

log = logging.getLogger(__name__)


class IndexFeed:
    def __init__(self, fleet: FleetView, events: KvEventSource | None, index: PrefixIndex,
                 stale_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.index = index
        self.batches: Counter[str] = Counter()  # batches received, per worker
        self.gaps: Counter[str] = Counter()  # batches lost for good, per worker
        self._fleet = fleet
        self._events = events
        self._stale = stale_seconds
        self._clock = clock
        self._expect_since: dict[str, float] = {}  # worker -> when it served an uncached prompt, no batch since
        self._last_batch: dict[str, float] = {}  # worker -> when its last batch arrived (the clock's time)
        self._blind_logged: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # set while started (and following events)
        self._timer: asyncio.TimerHandle | None = None
        fleet.subscribe(self._on_change)
        if events is not None:  # the index takes vLLM's common batches straight from their bytes, if it can
            # a catch-up's streams: the index's C bound once with this feed's book (no Python frame of ours a call)
            ready = index.ready_sink((self.batches, self._last_batch, self._expect_since), clock, self._blind_logged,
                                     self._flowing) if index.takes_ready else None
            events.bind(self.on_batch, self.on_gap, self.on_payload if index.takes_payloads else None,
                        self.on_socket if index.takes_sockets else None,
                        self.on_stream if index.takes_streams else None,
                        ready or (self.on_ready if index.takes_ready else None))

    @property
    def follows_events(self) -> bool:
        return self._events is not None

    async def start(self) -> None:
        """Watch the workers that were in the fleet before the feed subscribed to its changes."""
        for worker in self._fleet.workers().values():
            self._on_change(FleetChange("add", worker))
        if self._events is not None and self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._arm()  # for batches owed since before the start

    async def stop(self) -> None:
        self._loop = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        """(On the loop.) Unless a timer is set: one for when the first owed batch not yet logged is late,
        so that a silence is noticed (and logged) without waiting for the next decision. :meth:`tick` logs
        every owed batch that is late, so no timer is set again for one that already was."""
        if self._loop is None or self._timer is not None:
            return
        first = min((since for wid, since in self._expect_since.items() if wid not in self._blind_logged),
                    default=None)
        if first is not None:
            self._timer = self._loop.call_later(max(0.0, first + self._stale - self._clock()), self._due)

    def _due(self) -> None:
        self._timer = None
        self.tick()
        self._arm()

    def _on_change(self, change: FleetChange) -> None:
        worker = change.worker
        if change.kind != "remove":
            if self._events is not None:
                self._events.watch(worker)
            return
        wid = worker.instance_id
        if self._events is not None:
            self._events.unwatch(wid)
        self.index.remove_worker(wid)
        self._expect_since.pop(wid, None)
        self._last_batch.pop(wid, None)
        self._blind_logged.discard(wid)
        self.batches.pop(wid, None)
        self.gaps.pop(wid, None)

    def on_batch(self, worker_id: str, batch: EventBatch) -> None:
        """Feed one decoded batch of a worker's KV events into the index."""
        self.index.apply(worker_id, batch)
        self._arrived(worker_id)

    def on_payload(self, worker_id: str, payload: bytes) -> bool:
        """Feed one batch into the index from its msgpack payload, if the index takes it as it is (True);
        False: nothing changed, decode it and call :meth:`on_batch`. The same effects as :meth:`on_batch`."""
        if not self.index.apply_payload(worker_id, payload):
            return False
        self._arrived(worker_id)
        return True

    def on_socket(self, worker_id: str, handle: int, expected: int | None) -> tuple[int, int | None, Any] | None:
        """Feed every batch queued on a ZMQ socket into the index (:data:`infera.transport.base.SocketSink`); the
        same effects as :meth:`on_payload` batch by batch."""
        return self._drained(worker_id, self.index.drain_socket(worker_id, handle, expected))

    def on_stream(self, worker_id: str, fd: int, buffer: bytearray,
                  expected: int | None) -> tuple[int, int | None, Any] | None:
        """Feed every batch queued on a ZMTP stream into the index (:data:`infera.transport.base.StreamSink`); the
        same effects as :meth:`on_payload` batch by batch."""
        return self._drained(worker_id, self.index.drain_stream(worker_id, fd, buffer, expected))

    def on_ready(self, epfd: int,
                 streams: dict[int, StreamState]) -> tuple[list[int], list[tuple[StreamState, int, Any]]]:
        """A catch-up's ready ZMTP streams into the index in one call (:data:`infera.transport.base.ReadySink`); the
        same effects as :meth:`on_stream` stream by stream."""
        others, left, arrived = self.index.drain_ready(
            epfd, streams, book=(self.batches, self._last_batch, self._expect_since, self._clock()))
        if self._blind_logged:
            self._flowing(arrived)
        return others, left

    def _flowing(self, arrived: list[tuple[str, int]]) -> None:
        """The rest of :meth:`_arrived` for the workers a one-call catch-up booked: the log line of events that
        flow again."""
        for worker_id, _ in arrived:
            if worker_id in self._blind_logged:
                self._blind_logged.discard(worker_id)
                log.info("worker %s: KV events flow again", worker_id)

    def _drained(self, worker_id: str,
                 got: tuple[int, int | None, int, Any] | None) -> tuple[int, int | None, Any] | None:
        """A drain's answer with its applied batches counted as arrived; None (the index did not take it) passes."""
        if got is None:
            return None
        status, expected, n, extra = got
        if n:
            self._arrived(worker_id, n)
        return status, expected, extra

    def _arrived(self, worker_id: str, n: int = 1) -> None:
        """``n`` batches of ``worker_id``'s were applied: its events flow (:meth:`on_ready`'s one call keeps the same
        tables itself, :data:`infera.kv.index.Book`)."""
        self.batches[worker_id] += n
        self._last_batch[worker_id] = self._clock()
        self._expect_since.pop(worker_id, None)
        if worker_id in self._blind_logged:
            self._blind_logged.discard(worker_id)
            log.info("worker %s: KV events flow again", worker_id)

    def on_gap(self, worker_id: str, lost: int) -> None:
        """Batches were lost for good: the worker's view may miss removals, so drop it."""
        self.gaps[worker_id] += lost
        self.index.remove_worker(worker_id)

    def expect_events(self, worker_id: str, sent_at: float | None = None) -> None:
        """The worker computed an uncached prompt sent to it at ``sent_at`` (the clock's time; None:
        unknown): its events should follow within ``stale_seconds``, unless a batch arrived since."""
        worker = self._fleet.workers().get(worker_id)
        if worker is None or worker.kv_events is None or worker_id in self._expect_since:
            return
        last = self._last_batch.get(worker_id)
        if sent_at is not None and last is not None and last > sent_at:
            return  # its events already came (published as the prompt was computed, before the first byte)
        self._expect_since[worker_id] = self._clock()
        loop = self._loop
        if loop is not None and self._timer is None:  # a set timer falls before this batch is late
            if asyncio._get_running_loop() is loop:
                self._arm()
            else:
                loop.call_soon_threadsafe(self._arm)

    def blind(self, worker_id: str) -> bool:
        """True when the router cannot see this worker's cache through events (no side effects)."""
        worker = self._fleet.workers().get(worker_id)
        if worker is None or worker.kv_events is None or self._events is None:
            return True
        since = self._expect_since.get(worker_id)
        return since is not None and self._clock() - since >= self._stale

    def events_stale(self, worker_id: str) -> bool:
        """For metrics: the router follows KV events, and this worker's are missing or stale."""
        return self._events is not None and self.blind(worker_id)

    def holds(self, worker_id: str) -> bool:
        """Whether any state about ``worker_id`` is held here (for tests of what leaving releases)."""
        return (worker_id in self._expect_since or worker_id in self._blind_logged or worker_id in self.batches
                or worker_id in self.gaps or worker_id in self._last_batch)

    def tick(self) -> None:
        """Apply the batches waiting at the event source (a decision sees every batch that reached it before the
        decision started), then log the workers whose events went silent since the last tick (once per
        silence)."""
        if self._events is not None:
            self._events.catch_up()
        if not self._expect_since:
            return
        now = self._clock()
        for wid, since in self._expect_since.items():
            if wid not in self._blind_logged and now - since >= self._stale and self.blind(wid):
                self._blind_logged.add(wid)
                log.warning("worker %s: no KV events for %.1fs although it served uncached prompts; predicting "
                            "its cache from routing decisions until events return", wid, now - since)
