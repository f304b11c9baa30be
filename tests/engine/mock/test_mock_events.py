"""KV events from a real mock process: they rebuild the cache, replay fills gaps, mocks run side by side."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

import httpx
import openai
import zmq
from mock_harness import MockProcess

from harness.zmq_sub import subscribe
from infera.protocols.kv_events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
    seq_from_bytes,
    seq_to_bytes,
)

SYSTEMS = [f"System prompt number {i}: you are a careful assistant who answers in full sentences. " * 3
           for i in range(3)]


def _apply(held: collections.Counter[int], payload: bytes) -> None:
    for ev in decode_batch(payload).events:
        if isinstance(ev, BlockStored):
            held.update(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            held.subtract(ev.block_hashes)
        elif isinstance(ev, AllBlocksCleared):
            held.clear()


async def _workload(url: str, n: int) -> list[int]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    async def one(i: int) -> int:
        prompt = SYSTEMS[i % len(SYSTEMS)] + f"Question {i}: what is {i} squared?"
        resp = await client.completions.create(model="mock-model", prompt=prompt, max_tokens=5 + i % 7,
                                               stream=False)
        assert resp.usage is not None and resp.usage.prompt_tokens_details is not None
        return int(resp.usage.prompt_tokens_details.cached_tokens or 0)

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()


def _drain(sub: zmq.Socket[bytes], until_seq: int) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    while (not got or seq_from_bytes(got[-1][1]) < until_seq) and sub.poll(5000):
        got.append(sub.recv_multipart())
    return got


def test_events_rebuild_the_cache_and_replay(start_mock: Callable[..., MockProcess]) -> None:
    # A small cache so that requests evict each other's blocks and get preempted.
    mock = start_mock("--num-kv-blocks", "48", "--block-size", "16", "--speedup-ratio", "100",
                      "--max-num-batched-tokens", "256", "--max-num-seqs", "8")
    kv = mock.record["kv_events"]
    ctx = zmq.Context()
    sub = subscribe(ctx, kv["endpoint"])
    try:
        cached = asyncio.run(_workload(mock.url, 30))
        assert any(c > 0 for c in cached), "requests sharing a system prompt must hit the prefix cache"
        state = httpx.get(mock.url + "/infera/kv_cache").json()
        live = _drain(sub, state["next_seq"] - 1)
        assert [seq_from_bytes(m[1]) for m in live] == list(range(state["next_seq"]))
        held: collections.Counter[int] = collections.Counter()
        for msg in live:
            assert msg[0] == b"kv-events"
            _apply(held, msg[2])
        assert sorted(+held) == state["cached"]
        assert state["free_blocks"] == state["usable_blocks"]
        assert any(isinstance(ev, BlockRemoved) for m in live for ev in decode_batch(m[2]).events)

        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(kv["replay_endpoint"])
        dealer.send_multipart([b"only one frame"])  # invalid: ignored, the socket keeps answering
        start = max(0, len(live) - 3)
        dealer.send_multipart([b"", seq_to_bytes(start)])
        replayed: list[list[bytes]] = []
        while dealer.poll(5000):
            replayed.append(dealer.recv_multipart())
            if replayed[-1][2] == seq_to_bytes(REPLAY_END_SEQ):
                break
        assert replayed[-1] == [b"", b"", b"\xff" * 8, b""]
        assert [m[1:] for m in replayed[:-1]] == live[start:]
        dealer.close(0)

        reset = httpx.post(mock.url + "/reset_prefix_cache").json()
        assert reset == {"success": True}
        again = asyncio.run(_workload(mock.url, 1))
        assert again == [0]
        tail = _drain(sub, httpx.get(mock.url + "/infera/kv_cache").json()["next_seq"] - 1)
        assert isinstance(decode_batch(tail[0][2]).events[0], AllBlocksCleared)
    finally:
        sub.close(0)
        ctx.term()


def test_mocks_side_by_side_differ_only_by_port(start_mock: Callable[..., MockProcess]) -> None:
    mocks = [start_mock("--speedup-ratio", "100") for _ in range(3)]
    records = [m.record for m in mocks]
    assert len({r["instance_id"] for r in records}) == 3
    endpoints = {r["kv_events"]["endpoint"] for r in records} | {r["kv_events"]["replay_endpoint"] for r in records}
    assert len(endpoints) == 6
    ctx = zmq.Context()
    subs = []
    try:
        for r in records:
            subs.append(subscribe(ctx, r["kv_events"]["endpoint"]))
        for i, m in enumerate(mocks):
            body = {"model": "mock-model", "prompt": f"worker {i} " * 20, "max_tokens": 3}
            assert httpx.post(m.url + "/v1/completions", json=body).status_code == 200
        for i, sub in enumerate(subs):
            msg = _drain(sub, 0)[0]
            stored = decode_batch(msg[2]).events[0]
            assert isinstance(stored, BlockStored)
            assert bytes(stored.token_ids[:9]) == f"worker {i} ".encode()[:9]
            assert not sub.poll(100)  # each engine publishes only its own events
    finally:
        for sub in subs:
            sub.close(0)
        ctx.term()
