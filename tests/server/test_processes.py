"""``--workers N``: N serving processes on one port, each a whole frontend, stopped with the supervisor."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from harness import spawn, start_frontend, start_mock, wait_until
from tests.server.conftest import MOCK_ARGS, MODEL

pytestmark = pytest.mark.e2e


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
        return [int(p) for p in fh.read().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_processes_serve_one_port_and_stop_together(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    workers = [start_mock(tmp_path, model_path=qwen_tokenizer_dir, model=MODEL, args=MOCK_ARGS) for _ in range(2)]
    frontend = None
    try:
        frontend = start_frontend(tmp_path, workers, tokenizer=qwen_tokenizer_dir, policy="round-robin",
                                  args=("--workers", "2"))
        children = _children(frontend.pid)
        assert len(children) == 2
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        seen: set[str] = set()
        for i in range(24):  # a new connection each time: the kernel spreads them over both processes
            stream = i % 2 == 1
            with httpx.Client(timeout=30) as client:
                r = client.post(frontend.url + "/v1/chat/completions", json={**body, "stream": stream})
            assert r.status_code == 200, r.text
            assert r.text.rstrip().endswith("data: [DONE]") if stream else r.json()["choices"]
            seen.add(r.headers["x-infera-worker"])
        assert len(seen) == 2  # round-robin in each process: both engines served
        frontend.stop()
        wait_until(lambda: not any(_alive(c) for c in children), timeout=15, what="serving processes gone")
    finally:
        if frontend is not None:
            frontend.stop()
        for w in workers:
            w.stop()


@pytest.mark.parametrize("failure", ["timeout", "interrupt"])
def test_a_process_whose_start_fails_or_is_interrupted_is_stopped(tmp_path: Path, failure: str) -> None:
    """A starter's readiness wait that fails (or a pytest-timeout interrupting it) must not leave the process
    running: its caller never got the handle to stop it (a timed-out --workers test once left three frontends)."""
    proc = spawn([sys.executable, "-c", "import time; time.sleep(120)"], "", tmp_path / "sleeper.log")

    def never() -> bool:
        if failure == "interrupt":
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt if failure == "interrupt" else Exception):
        proc.ready_or_stopped(never, timeout=0.3, what="never ready")
    assert not proc.alive()
