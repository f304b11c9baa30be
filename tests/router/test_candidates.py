"""Cooldowns: a worker that fails before its first byte is avoided, longer each time it fails again."""

from __future__ import annotations

from infera.router.candidates import FIRST_BACKOFF, MAX_BACKOFF, Candidates
from tests.fakes import FakeFleet, worker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failures_during_a_cooldown_are_one_incident() -> None:
    clock = Clock()
    c = Candidates(FakeFleet(worker("a")), clock)
    for _ in range(40):  # 40 requests in flight on a worker that hung all fail at once
        c.failed("a")
    assert c.cooling_down() == {"a": FIRST_BACKOFF}
    clock.now += FIRST_BACKOFF + 0.01
    assert c.healthy("a")


def test_a_failure_after_the_cooldown_ran_out_doubles_it_up_to_the_cap() -> None:
    clock = Clock()
    c = Candidates(FakeFleet(worker("a")), clock)
    seen = []
    for _ in range(8):
        c.failed("a")
        left = c.cooling_down()["a"]
        seen.append(left)
        clock.now += left + 0.01
    assert seen == [1.0, 2.0, 4.0, 8.0, 16.0, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF]
    c.served("a")
    c.failed("a")
    assert c.cooling_down() == {"a": FIRST_BACKOFF}  # serving again resets the backoff
