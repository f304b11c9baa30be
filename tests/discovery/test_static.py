"""Static discovery: URLs and a watched workers file, against real mock engines."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from harness import Process, start_frontend, start_mock, wait_until
from infera.discovery.static import WorkersFileError, parse_workers_file


def ids(frontend: Process) -> set[str]:
    return {w["instance_id"] for w in httpx.get(frontend.url + "/v1/workers").json()["data"]}


def test_parse_workers_file_forms() -> None:
    assert parse_workers_file('["http://a", {"http_url": "http://b", "model": "m"}]') == [
        "http://a", {"http_url": "http://b", "model": "m"}]
    assert parse_workers_file('{"workers": ["http://a"]}') == ["http://a"]
    for bad in ("{", '{"workers": 3}', "[1, 2]"):
        with pytest.raises(WorkersFileError):
            parse_workers_file(bad)


def test_workers_file_is_watched_and_dead_workers_leave(tmp_path: Path) -> None:
    a = start_mock(tmp_path)
    b = start_mock(tmp_path)
    fleet_file = tmp_path / "fleet.json"
    fleet_file.write_text(json.dumps([a.url]))
    frontend = start_frontend(tmp_path, [], policy="round-robin", expect_workers=1,
                              args=("--workers-file", str(fleet_file)))
    try:
        a_id = httpx.get(a.url + "/infera/worker").json()["instance_id"]
        b_id = httpx.get(b.url + "/infera/worker").json()["instance_id"]
        assert ids(frontend) == {a_id}
        fleet_file.write_text(json.dumps([a.url, b.url]))
        wait_until(lambda: ids(frontend) == {a_id, b_id}, 15, "the added worker in the view")
        b.kill()
        wait_until(lambda: ids(frontend) == {a_id}, 15, "the dead worker gone from the view")
        fleet_file.write_text("{ broken")
        wait_until(lambda: "unreadable, keeping the last list" in frontend.output(), 15, "the broken file read")
        assert ids(frontend) == {a_id}, "a broken file keeps the last good list"
    finally:
        frontend.stop()
        a.stop()
        b.stop()


def test_record_object_for_an_engine_without_a_record_endpoint(tmp_path: Path) -> None:
    a = start_mock(tmp_path, model="m1")
    fleet_file = tmp_path / "fleet.json"
    fleet_file.write_text(json.dumps([{"http_url": a.url, "model": "m1", "instance_id": "plain-engine"}]))
    frontend = start_frontend(tmp_path, [], policy="round-robin", expect_workers=1,
                              args=("--workers-file", str(fleet_file)))
    try:
        assert ids(frontend) == {"plain-engine"}
        reply = httpx.post(frontend.url + "/v1/completions", json={"model": "m1", "prompt": "hi", "max_tokens": 3})
        assert reply.status_code == 200 and reply.headers["x-infera-worker"] == "plain-engine"
    finally:
        frontend.stop()
        a.stop()
