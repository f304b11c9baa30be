"""kv-aware's recency shadow in C (``infera.kv._native``: ``recency_touch`` / ``recency_value`` / ``recency_items``
over a ``U64Map(False)``, the value inside ``kv_terms``) against the pure path (kv_evict.PyShadow): the same shadow
after random touch sequences, the same oldest last use, the same value and eviction term to the bit."""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.load import TtftSample
from infera.kv.native import load as load_native
from infera.protocols.worker import Capacity, WorkerRecord
from infera.router.base import Candidate, PolicyDeps, RoutingContext
from infera.router.kv_evict import KvEvictPolicy, PyShadow
from tests.router.test_kv_native_pick import _Index, _Load

native = load_native()
pytestmark = pytest.mark.skipif(native is None, reason="the C extension infera.kv._native is not built")

# hashes from a small pool (so that touches meet earlier ones), some past 2**63, duplicates within one touch
hash_pool = st.sampled_from([0, 1, 7, 2**63 + 5, 2**64 - 1] + [k * 7919 for k in range(2, 40)])
touch = st.tuples(st.lists(hash_pool, max_size=24), st.floats(0.0, 1e4, allow_nan=False), st.integers(0, 40))


def _pair(touches: list[tuple[list[int], float, int]]) -> tuple[Any, PyShadow, list[tuple[float, float]]]:
    assert native is not None
    c, py = native.U64Map(False), PyShadow()
    oldest = []
    for hashes, when, limit in touches:
        oldest.append((native.recency_touch(c, hashes, when, limit), py.touch(hashes, when, limit)))
    return c, py, oldest


@settings(max_examples=400, deadline=None)
@given(st.lists(touch, max_size=30))
def test_the_shadow_after_random_touches_is_the_same(touches: list[tuple[list[int], float, int]]) -> None:
    assert native is not None
    c, py, oldest = _pair(touches)
    assert native.recency_items(c) == py.items()
    assert list(c) == list(py.lru) and len(c) == len(py.lru)
    for got, want in oldest:
        assert got == want or (math.isinf(got) and math.isinf(want))


@settings(max_examples=400, deadline=None)
@given(st.lists(touch, max_size=20), st.integers(-2, 60), st.floats(1e-3, 1e4), st.floats(0.0, 2e4))
def test_the_value_is_the_same_double(touches: list[tuple[list[int], float, int]], blocks: int, tau: float,
                                      now: float) -> None:
    assert native is not None
    c, py, _ = _pair(touches)
    assert native.recency_value(c, blocks, tau, now) == py.value(blocks, tau, now)


# a bigger pool and longer touches: values that walk tens of steps into the order, asked again and again between changes
wide_pool = st.integers(0, 180).map(lambda k: k * 104_729 + (2**63 if k % 5 == 0 else 0))
op = st.one_of(
    st.tuples(st.just("touch"), st.lists(wide_pool, max_size=60), st.integers(0, 200)),
    st.tuples(st.just("value"), st.integers(-2, 260), st.floats(1e-3, 1e2), st.floats(0.0, 80.0)),
    st.tuples(st.just("again"), st.lists(st.integers(0, 10**6), max_size=40), st.integers(0, 200)),  # known blocks
    st.tuples(st.just("del"), wide_pool),
    st.tuples(st.just("clear")),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(op, max_size=60))
def test_the_value_asked_between_changes_is_the_same_double(ops: list[tuple[Any, ...]]) -> None:
    """recency_value keeps where its last answer was in the order and starts the next walk there while the shadow is
    unchanged (issue 15's thirteenth round): any touch, delete or clear in between, and values asked nearer the head,
    the tail or the same place, answer what the pure path answers."""
    assert native is not None
    c, py = native.U64Map(False), PyShadow()
    for step, (kind, *rest) in enumerate(ops):
        if kind == "touch":  # at the time of its step, as the policy's clock moves: the blocks' last uses differ
            hashes, limit = rest
            got, want = native.recency_touch(c, hashes, float(step), limit), py.touch(hashes, float(step), limit)
            assert got == want or (math.isinf(got) and math.isinf(want))
        elif kind == "again":  # blocks it holds already (a prompt's cached prefix: the order changes, nothing added)
            picks, limit = rest
            known = list(py.lru)
            hashes = [known[k % len(known)] for k in picks] if known else []
            got, want = native.recency_touch(c, hashes, float(step), limit), py.touch(hashes, float(step), limit)
            assert got == want or (math.isinf(got) and math.isinf(want))
        elif kind == "value":
            blocks, tau, now = rest
            assert native.recency_value(c, blocks, tau, now) == py.value(blocks, tau, now)
        elif kind == "del":
            assert (c.pop(rest[0], None) is None) == (py.lru.pop(rest[0], None) is None)
        else:
            c.clear()
            py.lru.clear()
    assert native.recency_items(c) == py.items()


def test_the_value_after_a_touch_of_held_blocks_walks_the_new_order() -> None:
    """A cached prefix touched again adds nothing (no insertion, no eviction) but moves blocks out of the old end: the
    place of the last value's answer is stale, and the next value walks the new order."""
    assert native is not None
    c, py = native.U64Map(False), PyShadow()
    for k in range(10):  # ten prompts of ten blocks, one a second
        hashes = list(range(k * 10, k * 10 + 10))
        assert native.recency_touch(c, hashes, float(k), 1000) == py.touch(hashes, float(k), 1000)
    for blocks in (60, 60, 58, 64, 100, 4):
        assert native.recency_value(c, blocks, 1.0, 20.0) == py.value(blocks, 1.0, 20.0)
    again = list(range(0, 25))  # the oldest 25, touched again
    assert native.recency_touch(c, again, 11.0, 1000) == py.touch(again, 11.0, 1000)
    for blocks in (60, 62, 30, 100):
        assert native.recency_value(c, blocks, 1.0, 20.0) == py.value(blocks, 1.0, 20.0)
    assert native.recency_items(c) == py.items()


def test_a_shadow_is_a_plain_u64map_and_nothing_else() -> None:
    assert native is not None
    with pytest.raises(TypeError):
        native.recency_touch(native.U64Map(True), [1], 0.0, 4)
    with pytest.raises(TypeError):
        native.recency_touch({}, [1], 0.0, 4)
    shadow = native.U64Map(False)
    with pytest.raises(OverflowError):
        native.recency_touch(shadow, [1, 2, -3], 1.0, 8)
    assert native.recency_items(shadow) == []  # the failed touch left the table consistent
    native.recency_touch(shadow, [5, 6], 2.0, 8)
    with pytest.raises(TypeError):
        native.recency_touch(shadow, [5, "x"], 3.0, 8)
    assert sorted(native.recency_items(shadow)) == [(5, 2.0), (6, 2.0)]


@settings(max_examples=500, deadline=None)
@given(st.lists(touch, max_size=12), st.integers(0, 40_000), st.integers(0, 3_000), st.sampled_from([1, 4, 16]),
       st.integers(0, 20_000), st.integers(0, 40), st.sampled_from([0, 1, 50, 700]), st.integers(1, 5_000),
       st.integers(0, 30_000), st.floats(1e-3, 1e3), st.floats(0.0, 2e4), st.booleans())
def test_the_eviction_term_with_the_shadow_is_the_same_double(
        touches: list[tuple[list[int], float, int]], prompt_tokens: int, overlap: int, size: int, active: int,
        decoding: int, capacity: int, max_tokens: int, cached: int, tau: float, now: float, known: bool) -> None:
    """Every term of kv-aware's cost on one candidate, C (the shadow's value inside kv_terms) against Python."""
    c_shadow, py_shadow, _ = _pair(touches)
    worker = WorkerRecord(instance_id="w0", model="m", http_url="http://x", kv_block_size=size,
                          capacity=Capacity(kv_blocks=capacity))
    cand = Candidate(worker, decoding + 1, 0, active)
    ctx = RoutingContext(model="m", token_ids=None, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    got_want = []
    for mod, shadow in ((native, c_shadow), (None, py_shadow)):
        pol: Any = KvEvictPolicy(PolicyDeps(_Index(mod, 0, cached), 1.0, lambda w: False,  # type: ignore[arg-type]
                                            _Load(decoding), lambda: now))  # type: ignore[arg-type]
        pol._recency_args = ({"w0": shadow} if known else {}, tau, now)
        got_want.append(pol.terms(ctx, cand, overlap))
    got, want = got_want
    assert got == want and [type(x) for x in got] == [float] * 8, (got, want)


scale = st.tuples(st.integers(0, 40), st.floats(0.0, 5e4), st.one_of(st.just(0), st.floats(0.0, 5e4)),
                  st.floats(0.0, 500.0))


@settings(max_examples=600, deadline=None)
@given(st.lists(scale, max_size=9), st.sampled_from([0, 1, 8]), st.sampled_from([1.0, 1.5]))
def test_the_speed_scales_in_c_are_the_same_doubles(sums: list[tuple[int, float, float, float]], min_samples: int,
                                                    band: float) -> None:
    """kv_scales against KvTtftPolicy._relative_scales' Python: workers under and over the sample minimum, no
    modelled time, a zero fastest request, equal ratios (the median), ratios inside and past the dead band."""
    import infera.router.kv_ttft as kv_ttft
    from infera.router.kv_ttft import KvTtftPolicy, _Scale

    assert native is not None
    objs = []
    for n, observed, modelled, floor in sums:
        x = _Scale()
        x.n, x.observed, x.modelled, x.floor = n, observed, modelled, floor
        objs.append(x)
    pol: Any = KvTtftPolicy(PolicyDeps(_Index(None, 0, 0), 1.0, lambda w: False,  # type: ignore[arg-type]
                                       _Load(0), lambda: 0.0))  # type: ignore[arg-type]
    assert pol._c_scales is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_ttft, "MIN_SAMPLES", min_samples)
        mp.setattr(kv_ttft, "SCALE_DEAD_BAND", band)
        want = pol._scales_of(objs)
    got = native.kv_scales(objs, min_samples, band, kv_ttft.MAX_RELATIVE_SCALE)
    assert got == want and all(type(x) is float for x in got), (got, want)


def test_an_extension_built_before_the_shadow_was_in_c_still_routes_the_same() -> None:
    """A stale build (no recency_* functions): kv-aware keeps its shadow in Python and computes its terms there,
    with the same costs as on the current extension."""
    import types

    from infera.router.kv_evict import KvEvictPolicy as Policy
    from tests.router.test_kv_evict import SMALL, place
    from tests.router.test_kv_ttft import BS, Fleet, tokens

    assert native is not None
    stale = types.SimpleNamespace(**{k: getattr(native, k) for k in dir(native) if not k.startswith("recency")})
    costs = []
    for module in (native, stale):
        fleet = Fleet(Policy, SMALL)
        fleet.index._native = module
        fleet.policy = Policy(PolicyDeps(fleet.index, 1.0, lambda _w: False, fleet.load,
                                         lambda f=fleet: f.now))
        for t, (seed, wid) in enumerate([(1, "w0"), (2, "w1"), (1, "w0"), (3, "w1"), (2, "w1")]):
            fleet.now = 10.0 * t
            place(fleet, tokens(seed, 30 * BS), wid)
        ctx = RoutingContext(model="m", token_ids=tokens(9, 20 * BS), prompt_tokens=20 * BS, max_tokens=32)
        cands = [Candidate(w, 0, 0, 0) for w in fleet.workers]
        costs.append(fleet.policy.score(ctx, cands).costs)
        assert isinstance(fleet.policy, Policy) and fleet.policy.tau is not None
        shadows = list(fleet.policy._recency.values())
        assert shadows and all(isinstance(x, PyShadow) == (module is stale) for x in shadows)
    assert costs[0] == costs[1]
    assert costs[0][0] != costs[0][1]


def _window_py(parts: list[float], samples: Any, keep: int, capacity: int,
               seconds: Any) -> tuple[float, float]:
    """kv_window's definition: KvTtftPolicy._sums' Python (trim, model the new samples, both sums)."""
    from infera.router.kv_ttft import modelled_ms

    del parts[:len(parts) - keep]
    parts.extend(modelled_ms(1.0, x.queued_tokens + x.prefill_tokens, x.decoding, x.active_blocks, capacity)
                 for x in list(samples)[keep:])
    return sum(seconds) * 1000.0, sum(parts)


sample = st.builds(TtftSample, st.floats(0.0, 30.0), st.integers(0, 40_000), st.integers(0, 20_000),
                   st.integers(0, 80), st.integers(0, 30_000))


@settings(max_examples=600, deadline=None)
@given(st.lists(st.floats(0.0, 5e4), max_size=40), st.lists(sample, max_size=40), st.integers(-45, 45),
       st.sampled_from([0, 1, 50, 876, 20_000]), st.booleans(), st.booleans())
def test_the_window_refresh_in_c_is_the_same_doubles(parts: list[float], samples: list[TtftSample], keep: int,
                                                     capacity: int, as_deque: bool, int_second: bool) -> None:
    """kv_window against _sums' Python: the same parts kept and appended, the same two sums to the bit, from
    lists and deques (the tracker's), with a keep past either end (a slice's clamping); a second that is not a
    float: None, the parts updated all the same (the caller sums with sum())."""
    assert native is not None
    seconds: list[Any] = [x.seconds for x in samples]
    if int_second and seconds:
        seconds[len(seconds) // 2] = 3
    src: Any = collections.deque(samples) if as_deque else samples
    secs: Any = collections.deque(seconds) if as_deque else seconds
    want_parts, got_parts = list(parts), list(parts)
    want = _window_py(want_parts, src, keep, capacity, secs)
    got = native.kv_window(got_parts, src, keep, capacity, secs)
    assert got_parts == want_parts and all(type(x) is float for x in got_parts)
    if int_second and seconds:
        assert got is None
    else:
        assert got == want, (got, want)


def test_the_window_refresh_rejects_what_is_not_a_window() -> None:
    assert native is not None
    with pytest.raises(TypeError):
        native.kv_window((1.0,), [], 0, 10, [])
    with pytest.raises(AttributeError):
        native.kv_window([], [object()], 0, 10, [])
    assert native.kv_window([], [], 0, 10, []) == (0.0, 0.0)


@pytest.mark.parametrize("variant", ["stale", "pure", "window"])
def test_the_speed_scales_with_the_window_in_c_equal_the_python_window(variant: str) -> None:
    """Random loads through a real LoadTracker (a worker that leaves and comes back, a capacity change): the
    policy refreshing its windows in C (kv_refresh) keeps the same parts and sums, to the bit, as one on an
    extension built before kv_window, one on the pure path, and one built before kv_refresh (kv_window alone)."""
    import random
    import types

    from infera.router.kv_ttft import KvTtftPolicy
    from tests.router.test_kv_ttft import WORKERS, Fleet

    assert native is not None
    rng = random.Random(9)
    fleet = Fleet()
    c_pol = fleet.policy
    assert isinstance(c_pol, KvTtftPolicy) and c_pol._c_window is not None
    if variant == "stale":  # built before kv_window: the policy is made while the index answers that module
        real = fleet.index._native
        fleet.index._native = types.SimpleNamespace(**{k: getattr(native, k) for k in dir(native)
                                                       if k != "kv_window" and not k.startswith("__")})
        other = KvTtftPolicy(PolicyDeps(fleet.index, 1.0, lambda _w: False, fleet.load, lambda: fleet.now))
        fleet.index._native = real
        assert other._c_window is None and other._c_refresh is None and other._c_modelled is not None
    elif variant == "window":
        other = KvTtftPolicy(PolicyDeps(fleet.index, 1.0, lambda _w: False, fleet.load, lambda: fleet.now))
        assert c_pol._c_refresh is not None and other._c_window is not None
        other._c_refresh = None
    else:
        other = KvTtftPolicy(PolicyDeps(fleet.index, 1.0, lambda _w: False, fleet.load, lambda: fleet.now))
        other._c_window = other._c_modelled = other._c_scales = other._c_refresh = None
    workers = list(WORKERS)
    for step in range(300):
        wid = f"w{rng.randrange(4)}"
        if step in (100, 101):
            fleet.load.forget("w1")
            wid = "w1"
        for _ in range(rng.randrange(0, 4) if step not in (100, 101) else 40 + step - 100):
            t = fleet.load.begin(wid, rng.randrange(1, 9000), [], 1)
            fleet.now += rng.uniform(0.001, 0.5)
            fleet.load.prefill_done(t)
            fleet.load.end(t)
        if step == 200:
            workers[2] = workers[2].model_copy(update={"capacity": Capacity(kv_blocks=512)})
        cands = [Candidate(w, 0, 0, rng.randrange(0, 600)) for w in workers]
        assert c_pol._relative_scales(cands) == other._relative_scales(cands)
        assert [(s.n, s.observed, s.modelled, s.floor, s.parts) for s in map(c_pol._sums, cands)] == \
            [(s.n, s.observed, s.modelled, s.floor, s.parts) for s in map(other._sums, cands)]


def test_kv_refresh_leaves_the_sums_to_the_caller_when_a_second_is_no_float() -> None:
    """kv_refresh answers None, as kv_window, when an item is not a float (the caller sums with sum()); the other
    fields are set all the same, and the window's parts are kept and appended as kv_window keeps them."""
    from infera.kv.load import TtftSample
    from infera.router.kv_ttft import _Scale

    assert native is not None
    samples = [TtftSample(0.5, 100, 200, 1, 10), TtftSample(0.25, 0, 300, 0, 12)]
    sums = _Scale()
    assert native.kv_refresh(sums, samples, 2, 64, [0.5, 1], 0.25) is None
    assert (sums.count, sums.n, sums.capacity, sums.source, sums.floor) == (2, 2, 64, samples, 250.0)
    want: list[float] = []
    native.kv_window(want, samples, 0, 64, [0.5, 1])
    assert sums.parts == want and len(want) == 2
    fresh = _Scale()
    assert native.kv_refresh(fresh, samples, 2, 64, [0.5, 0.25], 0.25) == native.kv_window([], samples, 0, 64,
                                                                                          [0.5, 0.25])
    assert (fresh.observed, fresh.modelled) == native.kv_window([], samples, 0, 64, [0.5, 0.25])
