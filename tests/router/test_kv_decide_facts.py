"""kv-aware's one call keeps the workers' record values (id, block size, capacity) per candidates' list (issue 15's
eighteenth round, csrc/decide20.c): the same decisions as the candidates' path, which reads the records at every
decision, when the router hands over the same list again, when that list is changed in place (a record replaced at
its position by one with another id, block size or capacity, a record added or taken out), and when it hands over
another list."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.native import load as load_native
from infera.protocols.worker import Capacity, WorkerRecord
from tests.router.test_kv_decide import PROMPTS, SIZES, Side

pytestmark = pytest.mark.skipif(load_native() is None, reason="the C extension infera.kv._native is not built")


def _record(k: int, size: int, capacity: int) -> WorkerRecord:
    return WorkerRecord(instance_id=f"w{k}", model="m", http_url="http://x", kv_block_size=size,
                        capacity=Capacity(kv_blocks=capacity))


op = st.one_of(
    st.tuples(st.just("route"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 40)),
    st.tuples(st.just("route"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 40)),
    st.tuples(st.just("route"), st.integers(0, len(PROMPTS) - 1), st.integers(1, 40)),
    # a record replaced at its position in the same list: another worker, block size or capacity
    st.tuples(st.just("replace"), st.integers(0, 5), st.integers(0, 7), st.sampled_from(SIZES),
              st.sampled_from([0, 16, 48, 4096])),
    st.tuples(st.just("append"), st.integers(0, 7), st.sampled_from(SIZES), st.sampled_from([0, 16, 48, 4096])),
    st.tuples(st.just("drop"), st.integers(0, 5)),
    st.tuples(st.just("copy"),),  # another list with the same records
    st.tuples(st.just("first"), st.integers(0, 30), st.floats(0.001, 0.5)),
    st.tuples(st.just("end"), st.integers(0, 30)),
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(0, 2**32), st.lists(op, min_size=10, max_size=60))
def test_kept_values_decide_as_the_records(n: int, seed: int, ops: list[tuple[Any, ...]]) -> None:
    pool = [_record(k, SIZES[k % 2], 48) for k in range(n)]
    fast, slow = Side(True, pool, 0.0, seed), Side(False, pool, 0.0, seed)
    for o in ops:
        if o[0] == "route":
            got, want = fast.pick(PROMPTS[o[1]], o[2], pool), slow.pick(PROMPTS[o[1]], o[2], pool)
            assert got == want, o
            assert fast.policy._decide_facts[0] is pool  # kept for this very list
        elif o[0] == "replace":
            pool[o[1] % len(pool)] = _record(o[2], o[3], o[4])
        elif o[0] == "append":
            pool.append(_record(o[1], o[2], o[3]))
        elif o[0] == "drop" and len(pool) > 1:
            del pool[o[1] % len(pool)]
        elif o[0] == "copy":
            pool = list(pool)
        for side in (fast, slow):
            if o[0] == "first" and side.tickets:
                side.base += o[2]
                side.load.prefill_done(side.tickets[o[1] % len(side.tickets)])
            elif o[0] == "end" and side.tickets:
                side.load.end(side.tickets.pop(o[1] % len(side.tickets)))


def test_a_record_replaced_in_place_is_read_again() -> None:
    """The list object kept, one record swapped for one with another block size and capacity: the next decision
    reads the new record (a check of the list's identity alone would reuse the old values: another cost)."""
    pool = [_record(0, 4, 48), _record(1, 4, 48)]
    fast, slow = Side(True, pool, 0.0, 1), Side(False, pool, 0.0, 1)
    assert fast.pick(PROMPTS[0], 8, pool) == slow.pick(PROMPTS[0], 8, pool)
    kept = fast.policy._decide_facts[1]
    pool[1] = _record(1, 8, 4096)
    assert fast.pick(PROMPTS[1], 8, pool) == slow.pick(PROMPTS[1], 8, pool)
    assert fast.policy._decide_facts[1] != kept
    assert fast.pick(PROMPTS[2], 8, pool) == slow.pick(PROMPTS[2], 8, pool)


def test_a_bad_block_size_raises_and_keeps_nothing() -> None:
    """A record whose block size is not positive (model_construct skips the validation) is kv_decide's ValueError,
    as before, and no values are kept for that list."""
    pool = [_record(0, 4, 48), WorkerRecord.model_construct(instance_id="w1", model="m", http_url="http://x",
                                                            kv_block_size=0, capacity=Capacity(kv_blocks=48))]
    fast = Side(True, pool, 0.0, 1)
    with pytest.raises(ValueError, match="block size must be positive"):
        fast.pick(PROMPTS[0], 8, pool)
    assert fast.policy._decide_facts[0] is not pool
