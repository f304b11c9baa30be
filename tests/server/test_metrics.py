"""An endpoint's bound accounting records what one ``ServerMetrics.of`` call per observation records; the fast
observe and inc record what prometheus_client's own do."""

from __future__ import annotations

import math
import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infera.router.router import Router, RouterOptions
from infera.server.metrics import ITL_BUCKETS, LATENCY_BUCKETS, ServerMetrics, fast_buckets, fast_inc, fast_observe
from infera.server.tally import Usage
from tests.fakes import FakeFleet, FakeTransport, worker

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
STATUSES = ("200", "404", "499", "incomplete", "stream_error")


def metrics() -> ServerMetrics:
    router = Router(FakeFleet(worker("w1")), FakeTransport(None), None, None, RouterOptions(policy="round-robin"),
                    rng=random.Random(1))
    return ServerMetrics(router)


def by_hand(m: ServerMetrics, endpoint: str, status: str, started: float, ttft: float | None,
            usage: Usage | None) -> None:
    """The accounting as it was written before the children were bound: one ``of`` per observation."""
    if ttft is not None:
        m.of(m.ttft, endpoint).observe(ttft)
    m.of(m.requests, endpoint, status).inc()
    m.of(m.e2e, endpoint).observe(time.perf_counter() - started)
    if usage is not None:
        m.of(m.tokens, endpoint, "prompt").inc(usage.prompt_tokens)
        m.of(m.tokens, endpoint, "completion").inc(usage.completion_tokens)
        if usage.cached_tokens:
            m.of(m.tokens, endpoint, "cached").inc(usage.cached_tokens)


def samples(m: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in family.samples:
            if (s.name.startswith(("infera_requests", "infera_tokens", "infera_time_to_first", "infera_request_dur"))
                    and not s.name.endswith("_created")):  # a series' creation time
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_bound_accounts_record_what_one_of_per_observation_records() -> None:
    rng = random.Random(7)
    bound, reference = metrics(), metrics()
    for _ in range(300):
        endpoint = rng.choice(ENDPOINTS)
        status = rng.choice(STATUSES)
        # durations of ~7 s and times to first byte off the bucket bounds: the same bucket on both sides
        started = time.perf_counter() - 7
        ttft = rng.choice([None, 0.0007, 0.003, 0.2, 40.0])
        usage = rng.choice([None, Usage(), Usage(10, 2), Usage(1000, 8, 512)])
        bound.accounts(endpoint).record(status, started, ttft, usage)
        by_hand(reference, endpoint, status, started, ttft, usage)
    got, want = samples(bound), samples(reference)
    assert got.keys() == want.keys()
    for key, value in want.items():
        tolerance = 0.01 * 300 if key[0].endswith("duration_seconds_sum") else 0  # its clock reads differ
        assert abs(got[key] - value) <= tolerance, key


def test_a_series_appears_only_once_observed() -> None:
    m = metrics()
    m.accounts("/v1/completions").record("404", time.perf_counter(), None, None)
    names = {(name, dict(labels).get("kind")) for name, labels in samples(m)}
    assert ("infera_request_duration_seconds_count", None) in names
    assert not any(name.startswith(("infera_tokens", "infera_time_to_first")) for name, _ in names)
    m.accounts("/v1/completions").record("200", time.perf_counter(), 0.01, Usage(5, 1))
    kinds = {kind for name, kind in {(n, dict(labels).get("kind")) for n, labels in samples(m)}
             if name == "infera_tokens_total"}
    assert kinds == {"prompt", "completion"}


AMOUNTS = st.one_of(
    st.sampled_from([*LATENCY_BUCKETS, *ITL_BUCKETS, 0.0, -0.0, math.inf, -math.inf, math.nan]),  # on the bounds
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=200),
)


def _histograms() -> tuple[CollectorRegistry, Histogram, Histogram]:
    registry = CollectorRegistry()
    kw = {"labelnames": ["endpoint"], "buckets": LATENCY_BUCKETS, "registry": registry}
    return registry, Histogram("fast_h", "h", **kw), Histogram("public_h", "h", **kw)  # type: ignore[arg-type]


def _values(registry: CollectorRegistry, name: str) -> list[tuple[str, str, float]]:
    return [(s.name.removeprefix(name), s.labels.get("le", ""), s.value)
            for family in registry.collect() if family.name == name for s in family.samples
            if not s.name.endswith("_created")]


@settings(max_examples=300, deadline=None)
@given(st.lists(AMOUNTS, max_size=30))
def test_fast_observe_counts_each_amount_in_the_bucket_and_sum_observe_does(amounts: list[float]) -> None:
    registry, fast, public = _histograms()
    observe = fast_observe(fast.labels("/v1/x"))
    assert observe != public.labels("/v1/x").observe  # the fast path is taken with this prometheus_client
    for amount in amounts:
        observe(amount)
        public.labels("/v1/x").observe(amount)
    got, want = _values(registry, "fast_h"), _values(registry, "public_h")
    assert len(got) == len(want) == len(LATENCY_BUCKETS) + 3  # the buckets, +Inf, count, sum
    for (name, le, value), (name_, le_, value_) in zip(got, want, strict=True):
        assert (name, le) == (name_, le_)
        assert value == value_ or (math.isnan(value) and math.isnan(value_)), (name, le)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=200, allow_nan=False), max_size=30))
def test_fast_buckets_add_at_once_what_observe_adds_one_by_one(amounts: list[float]) -> None:
    registry, fast, public = _histograms()
    buckets = fast_buckets(fast.labels("/v1/x"))
    assert buckets is not None  # the fast path is taken with this prometheus_client
    counts = [0] * len(buckets.bounds)
    public.labels("/v1/x")  # a series from its child's making, as the fast one's
    for amount in amounts:
        counts[next(i for i, bound in enumerate(buckets.bounds) if amount <= bound)] += 1
        public.labels("/v1/x").observe(amount)
    buckets.add(counts, math.fsum(amounts))
    got, want = _values(registry, "fast_h"), _values(registry, "public_h")
    assert len(got) == len(want) == len(LATENCY_BUCKETS) + 3
    for (name, le, value), (name_, le_, value_) in zip(got, want, strict=True):
        assert (name, le) == (name_, le_)
        assert value == value_ if name != "_sum" else math.isclose(value, value_, abs_tol=1e-9), (name, le)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**9), max_size=20))
def test_fast_inc_adds_what_inc_adds(amounts: list[int]) -> None:
    registry = CollectorRegistry()
    fast = Counter("fast_c", "c", ["kind"], registry=registry)
    public = Counter("public_c", "c", ["kind"], registry=registry)
    inc = fast_inc(fast.labels("prompt"))
    for amount in amounts:
        inc(amount)
        public.labels("prompt").inc(amount)
    assert fast.labels("prompt")._value.get() == public.labels("prompt")._value.get() == float(sum(amounts))


def test_a_metrics_fast_observers_are_made_once_per_child() -> None:
    m = metrics()
    assert m.observer(m.itl, "/v1/completions") is m.observer(m.itl, "/v1/completions")
    assert m.counter(m.requests, "/v1/completions", "200") is m.counter(m.requests, "/v1/completions", "200")
    assert m.counter(m.requests, "/v1/completions", "200") is not m.counter(m.requests, "/v1/completions", "404")
