"""The index feed's staleness timer: no wakeup while no KV batch is owed, and a silence logged once
without another decision, whenever and from wherever the batch came to be owed."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import pytest

from infera.kv.feed import IndexFeed
from infera.kv.index import PrefixIndex
from infera.protocols.kv_events import BlockStored, EventBatch
from tests.fakes import FakeEvents, FakeFleet, worker

STALE = 0.1


def counted(feed: IndexFeed) -> list[float]:
    """The times of every ``tick`` the feed runs from now on."""
    ticks: list[float] = []
    tick = feed.tick

    def counting() -> None:
        ticks.append(time.monotonic())
        tick()

    feed.tick = counting  # type: ignore[method-assign]
    return ticks


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def feed_over(fleet: FakeFleet) -> tuple[IndexFeed, FakeEvents]:
    events = FakeEvents()
    return IndexFeed(fleet, events, PrefixIndex(), stale_seconds=STALE), events  # type: ignore[arg-type]


async def test_an_idle_feed_sets_no_timer() -> None:
    feed, _ = feed_over(FakeFleet(worker("a", events=True), worker("b", events=True)))
    ticks = counted(feed)
    await feed.start()
    await asyncio.sleep(4 * STALE)
    assert ticks == []  # the ticker it replaced woke every STALE / 2 (at most once a second)
    await feed.stop()


async def test_a_silence_is_logged_once_by_the_timer(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="infera.kv.feed")
    feed, _ = feed_over(FakeFleet(worker("a", events=True)))
    ticks = counted(feed)
    await feed.start()
    feed.expect_events("a")
    await until(lambda: "no KV events" in caplog.text, "the silence logged")
    assert feed.blind("a")
    logged = len(ticks)
    await asyncio.sleep(4 * STALE)
    assert len(ticks) == logged and caplog.text.count("no KV events") == 1  # no timer for a logged silence
    await feed.stop()


async def test_a_batch_in_time_logs_nothing_and_the_timer_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="infera.kv.feed")
    feed, events = feed_over(FakeFleet(worker("a", events=True)))
    ticks = counted(feed)
    await feed.start()
    feed.expect_events("a")
    events.sink("a", EventBatch(ts=0.0, events=[BlockStored(block_hashes=[1], parent_block_hash=None,
                                                            token_ids=list(range(16)), block_size=16)]))
    await asyncio.sleep(4 * STALE)
    assert len(ticks) <= 1 and "no KV events" not in caplog.text
    await feed.stop()


async def test_owed_before_the_start_or_from_another_thread(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="infera.kv.feed")
    feed, _ = feed_over(FakeFleet(worker("a", events=True), worker("b", events=True)))
    feed.expect_events("a")
    await feed.start()
    await until(lambda: "worker a: no KV events" in caplog.text, "a silence owed before the start")
    thread = threading.Thread(target=feed.expect_events, args=("b",))
    thread.start()
    thread.join()
    await until(lambda: "worker b: no KV events" in caplog.text, "a silence owed from another thread")
    await feed.stop()
