"""Static discovery's checks, in process over a fake ``get_json``: one GET per worker per check, and the
fleet a user sees (joins, departures after failed checks, changed records, restarts) the same as when
every record is validated afresh."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from infera.discovery.base import FleetChange
from infera.discovery.static import StaticFleet
from infera.protocols.worker import Capacity, KvEventEndpoint, WorkerRecord

URLS = ("http://w0:8000", "http://w1:8000", "http://w2:8000")
PLAIN = {"http_url": "http://plain:9000", "model": "m", "instance_id": "plain"}


class Down(Exception):
    pass


def record(url: str, instance: str = "", **fields: Any) -> dict[str, Any]:
    return {"instance_id": instance or url.split("//")[1].split(":")[0], "model": "m", "http_url": url,
            "engine": "mock", "kv_events": {"endpoint": "tcp://127.0.0.1:1", "topic": ""}, **fields}


class Workers:
    """What each URL answers now (a JSON value, or :class:`Down`); counts every GET by URL."""

    def __init__(self) -> None:
        self.answers: dict[str, object] = {}
        self.gets: Counter[str] = Counter()

    async def get_json(self, url: str, timeout: float) -> object:  # noqa: ASYNC109 (GetJson's signature)
        self.gets[url] += 1
        answer = self.answers.get(url, Down())
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)  # a fresh decode, as from the wire


def fleet_over(workers: Workers, fleet_class: type[StaticFleet] = StaticFleet) -> tuple[StaticFleet, list[FleetChange]]:
    fleet = fleet_class(workers.get_json, urls=[*URLS, PLAIN], unhealthy_after=2)  # type: ignore[list-item]
    changes: list[FleetChange] = []
    fleet.subscribe(changes.append)
    return fleet, changes


class Revalidating(StaticFleet):
    """The reference: the check as it was before records were remembered (every record validated
    afresh, every one upserted), but with one GET."""

    async def _check(self, entry: str | dict[str, Any]) -> None:
        key = entry if isinstance(entry, str) else str(entry["http_url"])
        base = key.rstrip("/")
        try:
            if isinstance(entry, str):
                raw = await self._get_json(base + "/infera/worker", self._timeout)
            else:
                await self._get_json(base + "/health", self._timeout)
                raw = {"instance_id": base, "http_url": base, **entry}
            record = WorkerRecord.model_validate(raw)
        except Exception:
            self._fail(key)
            return
        self._failures.pop(key, None)
        old_id = self._by_entry.get(key)
        if old_id is not None and old_id != record.instance_id:
            self._drop(old_id, "restarted with a new instance id")
        self._by_entry[key] = record.instance_id
        self._table.upsert(record)


async def test_each_check_is_one_get_per_worker() -> None:
    workers = Workers()
    for url in URLS:
        workers.answers[url + "/infera/worker"] = record(url)
    workers.answers[PLAIN["http_url"] + "/health"] = {}
    fleet, _ = fleet_over(workers)
    for _ in range(3):
        await fleet.refresh()
    assert set(fleet.workers()) == {"w0", "w1", "w2", "plain"}
    assert workers.gets == {**{url + "/infera/worker": 3 for url in URLS}, PLAIN["http_url"] + "/health": 3}


async def test_departures_returns_changes_and_restarts_are_seen() -> None:
    workers = Workers()
    for url in URLS:
        workers.answers[url + "/infera/worker"] = record(url)
    workers.answers[PLAIN["http_url"] + "/health"] = {}
    fleet, changes = fleet_over(workers)
    await fleet.refresh()
    held = fleet.workers()["w0"]
    await fleet.refresh()
    assert fleet.workers()["w0"] is held  # the same JSON: the same record, no change told
    assert [c.kind for c in changes] == ["add"] * 4
    changes.clear()

    workers.answers[URLS[0] + "/infera/worker"] = record(URLS[0], kv_block_size=32)
    await fleet.refresh()
    assert [(c.kind, c.worker.instance_id, c.worker.kv_block_size) for c in changes] == [("update", "w0", 32)]
    changes.clear()

    workers.answers[URLS[1] + "/infera/worker"] = Down()
    workers.answers[PLAIN["http_url"] + "/health"] = Down()
    await fleet.refresh()
    assert set(fleet.workers()) == {"w0", "w1", "w2", "plain"}  # one failed check is not enough
    await fleet.refresh()
    assert set(fleet.workers()) == {"w0", "w2"} and {c.kind for c in changes} == {"remove"}
    workers.answers[URLS[1] + "/infera/worker"] = record(URLS[1])
    workers.answers[PLAIN["http_url"] + "/health"] = {}
    changes.clear()
    await fleet.refresh()
    assert set(fleet.workers()) == {"w0", "w1", "w2", "plain"}
    assert sorted((c.kind, c.worker.instance_id) for c in changes) == [("add", "plain"), ("add", "w1")]
    changes.clear()

    workers.answers[URLS[2] + "/infera/worker"] = record(URLS[2], instance="w2-restarted")
    await fleet.refresh()
    assert [(c.kind, c.worker.instance_id) for c in changes] == [("remove", "w2"), ("add", "w2-restarted")]


def answers_for(url: str) -> st.SearchStrategy[object]:
    """A worker's answer: down, an invalid record, or one of a few records (some equal in Python but
    of other JSON types, some changed)."""
    return st.one_of(
        st.just(Down()),
        st.just({"model": "m"}),  # no instance id, no URL: invalid
        st.builds(lambda block, rank, chat, inst: record(url, instance=inst, kv_block_size=block, dp_rank=rank,
                                                         serves_chat=chat),
                  st.sampled_from([16, 16.0, 32]), st.sampled_from([0, 0.0, False, 1, True]),
                  st.sampled_from([None, True, 1, False]), st.sampled_from(["", "other"])))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(*(answers_for(u) for u in URLS), st.booleans()), min_size=1, max_size=12))
async def test_remembered_records_give_the_fleet_that_revalidating_gives(steps: list[tuple[Any, ...]]) -> None:
    fast, reference = Workers(), Workers()
    fleet, changes = fleet_over(fast)
    ref_fleet, ref_changes = fleet_over(reference, Revalidating)
    for *answers, plain_up in steps:
        for w in (fast, reference):
            for url, answer in zip(URLS, answers, strict=True):
                w.answers[url + "/infera/worker"] = answer
            w.answers[PLAIN["http_url"] + "/health"] = {} if plain_up else Down()
        await fleet.refresh()
        await ref_fleet.refresh()
        assert fleet.workers() == ref_fleet.workers()
        assert changes == ref_changes
    assert fast.gets == reference.gets
    assert sum(fast.gets.values()) == len(steps) * (len(URLS) + 1)


def test_json_values_python_holds_equal_validate_the_same_in_every_field() -> None:
    """What lets a record equal (``==``) to the last one skip validation: 1, 1.0 and true (and 0, 0.0,
    false) give the same record, or all fail, whatever field of the record (or its parts) they are in."""
    base = record(URLS[0], capacity={"kv_blocks": 1, "max_num_seqs": 1})
    paths = [(name,) for name in WorkerRecord.model_fields]
    paths += [("capacity", name) for name in Capacity.model_fields]
    paths += [("kv_events", name) for name in KvEventEndpoint.model_fields]
    for path in paths:
        for equal in ((1, 1.0, True), (0, 0.0, False)):
            outcomes = set()
            for value in equal:
                doc = copy.deepcopy(base)
                holder = doc
                for key in path[:-1]:
                    holder = holder[key]
                holder[path[-1]] = value
                try:
                    outcomes.add(WorkerRecord.model_validate(doc).model_dump_json())
                except ValueError:
                    outcomes.add("invalid")
            assert len(outcomes) == 1, (path, equal, outcomes)
