"""POST /v1/admin/profile/start|stop end to end: 403 without the flag, per-worker results with it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from harness import get_json, start_frontend, start_mock
from tests.server.conftest import MOCK_ARGS, MODEL
from tests.server.test_routing import ask, system_prompt

pytestmark = pytest.mark.slow  # spawns real processes


def test_profiling_and_prewarm_refuse_when_not_enabled(tmp_path: Path) -> None:
    mock = start_mock(tmp_path, model=MODEL, args=MOCK_ARGS)
    front = start_frontend(tmp_path, [mock], policy="round-robin")
    try:
        for action in ("start", "stop"):
            resp = httpx.post(front.url + f"/v1/admin/profile/{action}")
            assert resp.status_code == 403 and "--enable-profiling" in resp.json()["error"]["message"]
        prewarm = httpx.post(front.url + "/v1/cache/prewarm", json={"model": MODEL, "prompt": "x"})
        assert prewarm.status_code == 503 and "--kvd-socket-path" in prewarm.json()["error"]["message"]
    finally:
        front.stop()
        mock.stop()


def test_profiling_fans_out_and_reports_each_worker(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    profiles = tmp_path / "profiles"
    mocks = [start_mock(tmp_path, model=MODEL, model_path=qwen_tokenizer_dir,
                        args=(*MOCK_ARGS, "--profile-dir", str(profiles / str(i)))) for i in range(2)]
    ids = [get_json(m.url + "/infera/worker")["instance_id"] for m in mocks]
    # A slow health poll: the frontend still lists the worker killed below.
    front = start_frontend(tmp_path, mocks, tokenizer=qwen_tokenizer_dir, args=(
        "--enable-profiling", "--worker-poll-interval", "60", "--profile-timeout", "5",
        "--kvd-socket-path", str(tmp_path / "absent.sock")))
    url = front.url + "/v1/admin/profile"
    try:
        started = httpx.post(url + "/start", json={"num_steps": 1000})
        assert started.status_code == 200, started.text
        body = started.json()
        assert body["ok"] and [r["worker_id"] for r in body["workers"]] == sorted(ids)
        assert all(r["status"] == 200 and r["response"]["status"] == "started" for r in body["workers"])
        for i in range(2):
            ask(front.url + "/v1", [{"role": "system", "content": system_prompt(700 + i)},
                                    {"role": "user", "content": "hi"}])
        stopped = httpx.post(url + "/stop").json()
        assert stopped["ok"] and stopped["succeeded"] == 2
        steps = 0
        for result in stopped["workers"]:
            path = Path(result["response"]["path"])
            assert path.is_file() and profiles in path.parents
            steps += result["response"]["steps"]
        assert steps > 0

        named = httpx.post(url + "/start", json={"workers": [ids[0], "no-such-worker"]})
        assert named.status_code == 207
        by_id = {r["worker_id"]: r for r in named.json()["workers"]}
        assert by_id[ids[0]]["ok"] and not by_id["no-such-worker"]["ok"]
        assert by_id["no-such-worker"]["error"] == "not in the fleet"
        again = httpx.post(url + "/start", json={"workers": [ids[0]]})  # the engine refuses: already running
        assert again.status_code == 400 and again.json()["workers"][0]["status"] == 400

        mocks[1].kill()
        partial = httpx.post(url + "/stop")
        assert partial.status_code == 207
        by_id = {r["worker_id"]: r for r in partial.json()["workers"]}
        assert by_id[ids[0]]["ok"] and by_id[ids[0]]["response"]["status"] == "stopped"
        assert not by_id[ids[1]]["ok"] and by_id[ids[1]]["error"].startswith("unreachable")

        # a kvd socket that is configured but not there: 503, and the inference path is unaffected
        prewarm = httpx.post(front.url + "/v1/cache/prewarm", json={"model": MODEL, "prompt": "x " * 40,
                                                                     "worker": ids[0]})
        assert prewarm.status_code == 503 and "unreachable" in prewarm.json()["error"]["message"]
    finally:
        front.stop()
        for m in mocks:
            m.stop()
