"""Round-robin scores the worker records without the picker's candidates: no load read, the same rotation."""

from __future__ import annotations

import random

import pytest

from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.router.base import PolicyDeps, RoutingContext
from infera.router.pick import Picker, RouterStats
from infera.router.round_robin import CACHED_UP_TO, RoundRobinPolicy
from tests.fakes import worker

CTX = RoutingContext(model="m", token_ids=None, prompt_tokens=1, max_tokens=1)


class Unreadable(LoadTracker):
    """A load tracker that fails on any read a candidate would make."""

    def in_flight(self, worker_id: str) -> int:
        raise AssertionError("round-robin read a worker's load")

    prefill_tokens = active_blocks = in_flight


def policy() -> RoundRobinPolicy:
    return RoundRobinPolicy(PolicyDeps(index=PrefixIndex(), kv_overlap_weight=1.0, blind=lambda _: False))


@pytest.mark.parametrize("size", [1, 2, 4, CACHED_UP_TO + 1])
def test_the_picker_reads_no_load_for_round_robin_and_turns_in_id_order(size: int) -> None:
    workers = [worker(f"w{k:03d}") for k in range(size)]
    picker = Picker(PrefixIndex(), Unreadable(), RouterStats(), rng=random.Random(0))
    rr = policy()
    picked = [picker.pick(CTX, workers, rr, "round-robin").worker.instance_id for _ in range(3 * size)]
    assert picked == [w.instance_id for w in workers] * 3


@pytest.mark.parametrize("sizes", [[3, 3, 5, 2, 2, 1, 4], [CACHED_UP_TO + 1, 2, CACHED_UP_TO + 1]])
def test_scoring_the_records_is_scoring_the_candidates(sizes: list[int]) -> None:
    by_records, by_candidates = policy(), policy()
    load = LoadTracker()
    picker = Picker(PrefixIndex(), load, RouterStats())
    for n in sizes:
        workers = [worker(f"w{k}") for k in range(n)]
        fast = by_records.score_workers(CTX, workers, load)
        slow = by_candidates.score(CTX, picker._candidates(workers))
        assert (fast.costs, fast.reason, fast.overlap_blocks) == (slow.costs, slow.reason, slow.overlap_blocks)
