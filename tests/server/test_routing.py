"""KV-aware routing seen from outside: affinity, spread, direct mode, and two frontends."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import openai
import pytest

from harness import start_frontend, wait_indexed
from tests.server.conftest import MODEL, Fleet, make_fleet

pytestmark = pytest.mark.slow  # spawns fleets of real processes

WORDS = "amber basin cedar delta ember fjord grove harbor island jetty kettle lagoon meadow north orchard".split()


def system_prompt(seed: int, words: int = 300) -> str:
    rng = random.Random(seed)
    return f"Conversation {seed}. " + " ".join(rng.choice(WORDS) for _ in range(words))


def ask(base_url: str, messages: list[dict[str, str]], headers: dict[str, str] | None = None) -> tuple[str, int]:
    """Send a chat turn; return (worker that served it, cached prompt tokens)."""
    c = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=8,
                                                      extra_headers=headers or {})
    reply = raw.parse()
    details = reply.usage.prompt_tokens_details if reply.usage else None
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    return raw.headers["x-infera-worker"], (details.cached_tokens or 0) if details else 0


def test_conversations_stick_to_their_prefix_and_distinct_ones_spread(fleet: Fleet) -> None:
    chats = [[{"role": "system", "content": system_prompt(100 + i)}] for i in range(3)]
    served: dict[int, list[str]] = {i: [] for i in range(3)}
    cached: dict[int, list[int]] = {i: [] for i in range(3)}
    for turn in range(3):
        for i, messages in enumerate(chats):
            messages.append({"role": "user", "content": f"turn {turn}: go on"})
            worker, hit = ask(fleet.base_url, messages)
            served[i].append(worker)
            cached[i].append(hit)
            wait_indexed(fleet.frontend)  # the engine's KV events reached the router
    for i in range(3):
        assert len(set(served[i])) == 1, f"conversation {i} moved between workers: {served[i]}"
        assert all(c > 200 for c in cached[i][1:]), f"later turns of {i} were not cache hits: {cached[i]}"
    assert len({served[i][0] for i in range(3)}) == 3, f"distinct conversations did not spread: {served}"


def test_two_frontends_over_one_fleet_route_consistently(fleet: Fleet) -> None:
    second = start_frontend(fleet.tmp, fleet.workers, tokenizer=fleet.tokenizer)
    try:
        for seed in (200, 201, 202):
            messages = [{"role": "system", "content": system_prompt(seed)},
                        {"role": "user", "content": "first"}]
            first_worker, _ = ask(fleet.base_url, messages)
            wait_indexed(second)
            messages.append({"role": "user", "content": "second"})
            second_worker, hit = ask(second.url + "/v1", messages)
            assert second_worker == first_worker
            assert hit > 200
    finally:
        second.stop()


def test_direct_mode_obeys_the_header(tmp_path: Path, qwen_tokenizer_dir: Path) -> None:
    f = make_fleet(tmp_path, qwen_tokenizer_dir, n=2, frontend_args=("--router-mode", "direct"))
    try:
        ids = sorted(w["instance_id"] for w in httpx.get(f.base_url + "/workers").json()["data"])
        for wid in ids * 2:
            worker, _ = ask(f.base_url, [{"role": "user", "content": "hi"}], {"x-worker-instance-id": wid})
            assert worker == wid
        worker, _ = ask(f.base_url, [{"role": "user", "content": "no header: the policy picks"}])
        assert worker in ids
        c = openai.OpenAI(base_url=f.base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as exc:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                      extra_headers={"x-worker-instance-id": "not-a-worker"})
        assert exc.value.status_code == 503
        assert "not-a-worker" in str(exc.value)
    finally:
        f.stop()
