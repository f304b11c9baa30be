"""Prefill/decode pieces without processes: topology choice, connector bodies, the two legs' failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from harness import await_until
from infera.protocols.worker import WorkerRecord
from infera.router.connector import Pair
from infera.router.connectors import CONNECTORS
from infera.router.disagg import DisaggRouter, Leg, LegFailed
from infera.router.push import bootstrap_address
from infera.router.topology import choose, connector_of
from infera.transport.base import UpstreamError, UpstreamResponse


def worker(wid: str, role: str = "mixed", connector: str | None = None, engine: str = "mock",
           bootstrap: str | None = None) -> WorkerRecord:
    return WorkerRecord(instance_id=wid, model="m", role=role, engine=engine, http_url=f"http://10.0.0.1:{len(wid)}",
                        connector=connector, bootstrap_addr=bootstrap)


def always(_: str) -> bool:
    return True


# ---- topology ----------------------------------------------------------------------------

def test_a_prefill_and_a_decode_worker_make_a_pair_else_mixed_else_none() -> None:
    p, d, m = worker("p", "prefill", "pull"), worker("d", "decode", "pull"), worker("x")
    assert choose([p, d, m], "m", always).kind == "pd"
    assert choose([p, d, m], "m", always).connector == "pull"
    assert choose([p, m], "m", always).kind == "mixed"  # no decode worker: fall back
    assert choose([d, m], "m", always).kind == "mixed"
    none = choose([p], "m", always)
    assert none.kind == "none"
    assert "1 prefill and 0 decode" in none.explain("m")
    assert choose([p, d], "other-model", always).kind == "none"


def test_pairs_only_within_one_connector_and_healthy_ones_first() -> None:
    p, d = worker("p", "prefill", "push"), worker("d", "decode", "pull")
    assert choose([p, d, worker("x")], "m", always).kind == "mixed"
    d2 = worker("d2", "decode", "push")
    assert choose([p, d, d2], "m", always).connector == "push"
    # the only decode worker cools down: a healthy mixed worker is preferred; with none, try the pair anyway
    assert choose([p, d2, worker("x")], "m", lambda w: w != "d2").kind == "mixed"
    assert choose([p, d2], "m", lambda w: w != "d2").kind == "pd"


def test_connector_defaults_to_the_engines_own() -> None:
    assert connector_of(worker("a", "prefill", engine="sglang")) == "push"
    assert connector_of(worker("a", "prefill", engine="vllm")) == "pull"
    assert connector_of(worker("a", "prefill", "push", engine="vllm")) == "push"


# ---- connector bodies --------------------------------------------------------------------

PAYLOAD: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
                           "max_completion_tokens": 50, "stream": True, "stream_options": {"include_usage": True}}


def test_push_sends_the_same_body_with_bootstrap_fields_to_both() -> None:
    pair = Pair(worker("p", "prefill", "push", bootstrap="10.1.2.3:8998"), worker("d", "decode", "push"), 12345)
    push = CONNECTORS["push"]
    assert push.concurrent
    for body in (push.prefill_body(PAYLOAD, pair), push.decode_body(PAYLOAD, pair, None)):
        assert body == {**PAYLOAD, "bootstrap_host": "10.1.2.3", "bootstrap_port": 8998, "bootstrap_room": 12345}
    assert bootstrap_address(worker("p", "prefill")) == ("10.0.0.1", 8998)  # no record field: SGLang's default


def test_pull_asks_the_prefill_for_one_token_then_hands_its_params_to_the_decode() -> None:
    pair = Pair(worker("p", "prefill", "pull"), worker("d", "decode", "pull"), 1)
    pull = CONNECTORS["pull"]
    assert not pull.concurrent
    first = pull.prefill_body(PAYLOAD, pair)
    assert first["max_tokens"] == 1 and first["max_completion_tokens"] == 1 and first["stream"] is False
    assert "stream_options" not in first
    assert first["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                           "remote_engine_id": None, "remote_block_ids": None,
                                           "remote_host": None, "remote_port": None}
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p",
              "remote_block_ids": [1, 2], "remote_host": "10.0.0.1", "remote_port": 5600}
    second = pull.decode_body(PAYLOAD, pair, {"choices": [], "kv_transfer_params": params})
    assert second == {**PAYLOAD, "kv_transfer_params": params}
    assert pull.decode_body(PAYLOAD, pair, {"choices": []}) == PAYLOAD  # none returned: decode computes it


# ---- the two legs ------------------------------------------------------------------------

class FakeLegs:
    """Legs that succeed, fail before their first byte, or hang, and record every open and release."""

    def __init__(self, fail: set[str] = frozenset(), delay: dict[str, float] | None = None,  # type: ignore[assignment]
                 body: bytes = b'{"kv_transfer_params": {"do_remote_prefill": true}}') -> None:
        self.fail = fail
        self.delay = delay or {}
        self.body = body
        self.open: dict[str, int] = {}
        self.bodies: dict[str, Any] = {}

    async def __call__(self, w: WorkerRecord, role: str, body: bytes) -> Leg:
        self.open[role] = self.open.get(role, 0) + 1
        self.bodies[role] = orjson.loads(body)
        try:
            await asyncio.sleep(self.delay.get(role, 0.0))
            if role in self.fail:
                raise UpstreamError(f"{role} down")
        except BaseException:
            self.open[role] -= 1
            raise

        async def rest() -> AsyncIterator[bytes]:
            yield b""

        def release() -> None:
            self.open[role] -= 1

        upstream = UpstreamResponse(200, "application/json", rest(), lambda: None)
        return Leg(w, upstream, self.body if role == "prefill" else b"data: x\n\n", release)

    def released(self) -> bool:
        return all(n == 0 for n in self.open.values())


@pytest.mark.parametrize("name", ["push", "pull"])
async def test_legs_succeed_and_release_both(name: str) -> None:
    pair = Pair(worker("p", "prefill", name), worker("d", "decode", name), 7)
    legs = FakeLegs()
    routed = await DisaggRouter().run(CONNECTORS[name], pair, PAYLOAD, legs)
    assert (routed.worker_id, routed.prefill_worker_id) == ("d", "p")
    assert b"".join([c async for c in routed.chunks()]) == b"data: x\n\n"
    await asyncio.sleep(0)
    assert legs.released()
    if name == "pull":
        assert legs.bodies["decode"]["kv_transfer_params"] == {"do_remote_prefill": True}


@pytest.mark.parametrize("name", ["push", "pull"])
@pytest.mark.parametrize("failing", ["prefill", "decode"])
async def test_a_failed_leg_is_named_and_nothing_stays_open(name: str, failing: str) -> None:
    pair = Pair(worker("p", "prefill", name), worker("d", "decode", name), 7)
    # push: the decode leg is slow (it waits for the KV), so a failed prefill is seen first
    legs = FakeLegs(fail={failing}, delay={"decode": 0.05})
    with pytest.raises(LegFailed) as exc:
        await DisaggRouter().run(CONNECTORS[name], pair, PAYLOAD, legs)
    assert exc.value.role == failing
    assert legs.released()


async def test_push_blames_the_prefill_when_both_legs_fail() -> None:
    # The decode worker's KV transfer broke because the prefill worker died: retry the prefill pool.
    pair = Pair(worker("p", "prefill", "push"), worker("d", "decode", "push"), 7)
    legs = FakeLegs(fail={"prefill", "decode"}, delay={"prefill": 0.05})
    with pytest.raises(LegFailed) as exc:
        await DisaggRouter().run(CONNECTORS["push"], pair, PAYLOAD, legs)
    assert exc.value.role == "prefill"
    assert legs.released()


@pytest.mark.parametrize("name", ["push", "pull"])
async def test_a_cancelled_dispatch_releases_both_legs(name: str) -> None:
    pair = Pair(worker("p", "prefill", name), worker("d", "decode", name), 7)
    legs = FakeLegs(delay={"prefill": 10.0, "decode": 10.0})
    task = asyncio.ensure_future(DisaggRouter().run(CONNECTORS[name], pair, PAYLOAD, legs))
    await await_until(lambda: sum(legs.open.values()) > 0, 5, "the dispatch waiting in a leg")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert legs.released()
