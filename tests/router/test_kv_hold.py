"""kv-aware-hold: a request waits for the worker holding its prefix while that worker's queue is nearly computed.

The Mooncake trace at 64 busy workers (bench/README.md, "Sixth round (helper place4)"): most requests that left
the holder of their prefix did so because of the prompts queued there, which the cost counted whole although
the holder had been computing them for a while. ``kv-aware-hold`` credits a holder's queue with ``HOLD_SHARE`` of
that time (the router's own ``LoadTracker.prefill_age``); a queue on any other worker is counted whole, as before.
"""

from __future__ import annotations

from infera.kv.hashing import block_hashes
from infera.router.base import Candidate, RoutingContext
from infera.router.kv_ttft import HOLD_SHARE, KvTtftBusyPolicy, KvTtftHoldPolicy, KvTtftPolicy, prefill_ms
from tests.router.test_kv_ttft import BS, Fleet, tokens

QUEUED = 3500  # prompt tokens queued on the holder: prefill_ms(3500) ~ 75 ms in the mock's step model


def session_behind_a_computing_queue(policy: type[KvTtftPolicy], computed_ms: float, others_queue: int = 0) -> str:
    """A session cached 150 blocks deep on w0 behind QUEUED tokens of prefill that w0 has been computing for
    ``computed_ms``; the other workers are idle, or have ``others_queue`` tokens queued that just arrived.
    Where does its next turn go?"""
    fleet = Fleet(policy)
    session = tokens(1, 2560)
    fleet.cache("w0", session[:2400])
    fleet.load.begin("w0", QUEUED, block_hashes(tokens(10, QUEUED), BS), 3)
    fleet.now += computed_ms / 1000.0
    if others_queue:
        for k, wid in enumerate(("w1", "w2", "w3")):
            fleet.load.begin(wid, others_queue, block_hashes(tokens(20 + k, others_queue), BS), 3)
    return fleet.pick(session)


def test_a_session_waits_for_a_holder_nearly_through_its_queue() -> None:
    """w0 has been computing the queue (~75 modelled ms) for 70 ms: the session's turn gets its first token there
    sooner than by recomputing 2,400 tokens on an idle worker. kv-aware-busy counts the whole queue and moves it."""
    assert prefill_ms(QUEUED) > 70.0
    assert session_behind_a_computing_queue(KvTtftHoldPolicy, 70.0) == "w0"
    assert session_behind_a_computing_queue(KvTtftBusyPolicy, 70.0) != "w0"
    assert session_behind_a_computing_queue(KvTtftPolicy, 70.0) != "w0"


def test_a_queue_the_holder_has_just_started_still_moves_the_session() -> None:
    """The same queue just routed to w0 (nothing computed yet): the holder gets no credit, and the session moves
    as it does under kv-aware-busy."""
    assert session_behind_a_computing_queue(KvTtftHoldPolicy, 0.0) != "w0"
    assert session_behind_a_computing_queue(KvTtftBusyPolicy, 0.0) != "w0"


def test_only_the_holder_is_credited() -> None:
    """Every worker has the same queue, computed for 50 ms; only w2 holds the request's prefix. Its queue counts
    what is left (the modelled queue less HOLD_SHARE x 50 ms), every other worker's counts whole, as in
    kv-aware-busy."""
    fleet = Fleet(KvTtftHoldPolicy)
    for k, wid in enumerate(("w0", "w1", "w2", "w3")):
        fleet.load.begin(wid, QUEUED, block_hashes(tokens(10 + k, QUEUED), BS), 3)
    fleet.now += 0.05
    session = tokens(1, 2560)
    fleet.cache("w2", session[:2400])
    ctx = RoutingContext(model="m", token_ids=session, prompt_tokens=len(session), max_tokens=32)
    cands = [Candidate(w, fleet.load.in_flight(w.instance_id), fleet.load.prefill_tokens(w.instance_id),
                       fleet.load.active_blocks(w.instance_id)) for w in fleet.workers]
    policy = fleet.policy
    assert isinstance(policy, KvTtftHoldPolicy)
    scores = policy.score(ctx, cands)
    assert scores.overlap_blocks == [0, 0, 150, 0]
    prefill = [policy.terms(ctx, c, o)[0] for c, o in zip(cands, scores.overlap_blocks, strict=True)]
    assert abs(prefill[2] - (prefill_ms(QUEUED) - HOLD_SHARE * 50.0 + prefill_ms(160))) < 1e-6
    assert abs(prefill[0] - prefill_ms(QUEUED + 2560)) < 1e-6
    assert prefill[0] == prefill[1] == prefill[3]
