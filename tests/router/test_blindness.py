"""The blindness rule: a worker that computed an uncached prompt owes KV events, unless they already came.

An engine publishes a prompt's ``BlockStored`` at the start of the step that computes it, so the
batch usually reaches the router before the first byte does. The "events owed" clock must not
start after that batch (it would never be stopped if the worker then stays idle, and the router
would predict a cache it can read).
"""

from __future__ import annotations

import random
from typing import cast

from infera.kv.tokenizer import PromptRenderer
from infera.protocols.kv_events import BlockStored, EventBatch
from infera.router.context import RouteRequest
from infera.router.router import Router, RouterOptions
from tests.fakes import MODEL, FakeEvents, FakeFleet, FakeTransport, worker

BS = 16
STALE = 5.0


class Clocked:
    def __init__(self) -> None:
        self.now = 0.0
        self.events = FakeEvents()
        # the prompt arrives as token ids: no renderer is called (as in the simulator)
        self.router = Router(FakeFleet(worker("w0", events=True, kv_block_size=BS)), FakeTransport(), self.events,
                             cast(PromptRenderer, object()),
                             RouterOptions(policy="kv-aware", events_stale_seconds=STALE), clock=lambda: self.now,
                             rng=random.Random(0))

    def stale(self) -> bool:
        return self.router.view.workers()[0].kv_events_stale

    def place(self, tokens: list[int]) -> object:
        return self.router.place_now(RouteRequest(kind="completion", path="/v1/completions", body=b"", model=MODEL,
                                                  payload={"prompt": tokens}, max_tokens=4))

    def publish(self, tokens: list[int]) -> None:
        n = len(tokens) // BS
        self.events.sink("w0", EventBatch(ts=self.now, events=[BlockStored(
            block_hashes=[hash((tuple(tokens[:BS]), k)) & 0xFFFF_FFFF for k in range(n)], parent_block_hash=None,
            token_ids=tokens[: n * BS], block_size=BS)]))


def test_events_that_arrive_before_the_first_byte_count() -> None:
    c = Clocked()
    prompt = list(range(1, 4 * BS + 3))
    placement = c.place(prompt)
    c.now = 0.010
    c.publish(prompt)  # the step that computes the prompt published its blocks
    c.now = 0.040
    placement.answered()  # type: ignore[attr-defined]  # the first byte, after the batch
    c.now = 0.040 + 2 * STALE  # the worker stays idle: no further batch
    assert not c.stale()


def test_a_worker_whose_events_never_come_goes_stale() -> None:
    c = Clocked()
    placement = c.place(list(range(1, 4 * BS + 3)))
    c.now = 0.040
    placement.answered()  # type: ignore[attr-defined]
    c.now = 0.040 + STALE / 2
    assert not c.stale()
    c.now = 0.040 + 2 * STALE
    assert c.stale()


def test_a_batch_from_before_the_dispatch_does_not_count() -> None:
    c = Clocked()
    c.publish(list(range(500, 500 + 2 * BS)))  # an earlier request's blocks
    c.now = 1.0
    placement = c.place(list(range(1, 4 * BS + 3)))
    c.now = 1.040
    placement.answered()  # type: ignore[attr-defined]
    c.now = 1.040 + 2 * STALE
    assert c.stale()
