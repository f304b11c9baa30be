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


def test_the_topology_follows_fleet_changes_and_cooldowns() -> None:
    """The topology is kept between requests; a joining pair, a cooldown and its end still change it."""
    clock = Clock()
    fleet = FakeFleet(worker("m1"))
    c = Candidates(fleet, clock)
    assert c.topology("m", "chat").kind == "mixed"
    assert c.topology("m", "chat").kind == "mixed"
    fleet.add(worker("p1", "prefill", connector="pull"))
    assert c.topology("m", "chat").kind == "mixed"  # a prefill worker alone makes no pair
    fleet.add(worker("d1", "decode", connector="pull"))
    assert (c.topology("m", "chat").kind, c.topology("m", "chat").connector) == ("pd", "pull")
    c.failed("d1")  # the pair's decode worker cools down: mixed until it serves again
    assert c.topology("m", "chat").kind == "mixed"
    c.served("d1")
    assert c.topology("m", "chat").kind == "pd"
    fleet.remove("p1")
    assert c.topology("m", "chat").kind == "mixed"
    fleet.remove("m1")
    assert c.topology("m", "chat").kind == "none"
    assert c.topology("other", "chat").kind == "none"
