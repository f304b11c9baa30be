"""The mock's host-memory KV tier and kvd socket, and its profiler endpoints."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import zmq
from mock_harness import MockProcess

from harness import wait_until
from infera.engine.mock.cache import BlockPool
from infera.engine.mock.hashing import event_hash, extend_digests
from infera.engine.mock.host_tier import HostTier
from infera.kv.hashing import block_hashes
from infera.protocols.kv_events import REPLAY_END_SEQ, BlockRemoved, BlockStored, decode_batch, seq_to_bytes
from infera.protocols.kvd import make_hint
from infera.transport.kvd import KvdClient

BS = 16


def prompt(seed: int, n_tokens: int) -> list[int]:
    return [(seed * 31 + i * 7) % 250 + 1 for i in range(n_tokens)]


def chain(tokens: list[int], bs: int = BS) -> list[bytes]:
    digests: list[bytes] = []
    extend_digests(digests, tokens, bs)
    return digests


def test_stage_then_promote_makes_device_hits_and_host_lru_evicts() -> None:
    pool = BlockPool(32, 4)
    tier = HostTier(pool, capacity=6, promote_seconds=0.0)
    tokens = list(range(20))  # 5 blocks of 4
    digests = chain(tokens, 4)
    end = tier.stage(digests, tokens, 0)
    assert end == 5 and len(tier) == 5
    [cpu] = tier.take_events()
    assert isinstance(cpu, BlockStored) and cpu.medium == "CPU" and cpu.parent_block_hash is None
    assert cpu.block_hashes == [event_hash(d) for d in digests] and cpu.token_ids == tokens
    assert tier.promote(digests, tokens, end) == 5
    [gpu] = pool.take_events()
    assert isinstance(gpu, BlockStored) and gpu.medium == "GPU" and gpu.block_hashes == cpu.block_hashes
    assert len(pool.lookup(digests)) == 5 and pool.num_free == pool.num_usable  # cached, unreferenced
    assert tier.promote(digests, tokens, end) == 0  # already warm
    other = list(range(100, 112))  # 3 more blocks: the LRU drops the 2 oldest
    tier.stage(chain(other, 4), other, 0)
    events = tier.take_events()
    assert [type(e) for e in events] == [BlockStored, BlockRemoved, BlockRemoved]
    assert all(e.medium == "CPU" for e in events if isinstance(e, BlockRemoved))
    assert len(tier) == 6 and digests[0] not in tier


def _all_events(record: dict[str, Any]) -> list[Any]:
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(record["kv_events"]["replay_endpoint"])
    dealer.send_multipart([b"", seq_to_bytes(0)])
    events: list[Any] = []
    while dealer.poll(5000):
        msg = dealer.recv_multipart()
        if msg[2] == seq_to_bytes(REPLAY_END_SEQ):
            break
        events.extend(decode_batch(msg[3]).events)
    dealer.close(0)
    ctx.term()
    return events


def _cached_tokens(url: str, tokens: list[int]) -> int:
    body = httpx.post(url + "/v1/completions", json={"model": "mock-model", "prompt": tokens, "max_tokens": 1},
                      timeout=30).json()
    return int(body["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_a_kvd_hint_turns_the_next_request_into_a_hit(start_mock: Callable[..., MockProcess], tmp_path: Path) -> None:
    sock = tmp_path / "kvd.sock"
    mock = start_mock("--kvd-socket-path", str(sock), "--speedup-ratio", "20", "--host-promote-ms-per-block", "2")
    worker = mock.record["instance_id"]
    tokens = prompt(1, 8 * BS + 3)
    hint = make_hint(worker, "mock-model", BS, block_hashes(tokens, BS), tokens)
    other_worker = make_hint("someone-else", "mock-model", BS, block_hashes(tokens, BS), tokens)

    async def send() -> None:
        client = KvdClient(str(sock))
        await client.send(other_worker)
        await client.send(hint)

    asyncio.run(send())
    wait_until(lambda: httpx.get(mock.url + "/infera/host_tier").json()["blocks_promoted"] >= 8, 10,
               "8 blocks promoted from the host tier")
    view: dict[str, Any] = httpx.get(mock.url + "/infera/host_tier").json()
    assert view["blocks_promoted"] == 8 and view["blocks_staged"] == 8 and view["hints_other_worker"] == 1
    expected = [event_hash(d) for d in chain(tokens)]
    assert set(expected) <= set(httpx.get(mock.url + "/infera/kv_cache").json()["cached"])
    assert set(expected) == set(view["hashes"])

    assert _cached_tokens(mock.url, tokens) == 8 * BS  # a hit, without ever having served this prompt
    assert _cached_tokens(mock.url, prompt(2, 8 * BS + 3)) == 0  # a prompt never hinted: a miss

    stored = [e for e in _all_events(mock.record) if isinstance(e, BlockStored)]
    assert [e.medium for e in stored[:2]] == ["CPU", "GPU"]  # staged in host memory, then promoted
    assert stored[0].block_hashes == stored[1].block_hashes == expected
    assert stored[0].token_ids == tokens[:8 * BS]


def test_the_mock_records_a_profile_window(start_mock: Callable[..., MockProcess], tmp_path: Path) -> None:
    mock = start_mock("--speedup-ratio", "20", "--profile-dir", str(tmp_path / "default"))
    assert httpx.post(mock.url + "/stop_profile").status_code == 400  # nothing to stop
    started = httpx.post(mock.url + "/start_profile", json={"output_dir": str(tmp_path / "prof")})
    assert started.status_code == 200 and started.json()["status"] == "started"
    assert httpx.post(mock.url + "/start_profile").status_code == 400  # already running
    _cached_tokens(mock.url, prompt(3, 40))
    stopped = httpx.post(mock.url + "/stop_profile").json()
    path = Path(stopped["path"])
    assert path.parent == tmp_path / "prof" and stopped["steps"] >= 1
    trace = json.loads(path.read_text())
    steps = trace["traceEvents"]
    assert len(steps) == stopped["steps"] and steps[0]["name"] == "prefill" and steps[0]["args"]["prefill_tokens"] > 0
    # num_steps: the window closes by itself (SGLang's semantics), into --profile-dir by default
    assert httpx.post(mock.url + "/start_profile", json={"num_steps": 1}).status_code == 200
    _cached_tokens(mock.url, prompt(4, 40))
    wait_until(lambda: list((tmp_path / "default").glob("*.trace.json")), 5, "the one-step profile written")
    [auto] = list((tmp_path / "default").glob("*.trace.json"))
    assert len(json.loads(auto.read_text())["traceEvents"]) == 1
