"""An endpoint's bound accounting records what one ``ServerMetrics.of`` call per observation records."""

from __future__ import annotations

import random
import time

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infera.router.router import Router, RouterOptions
from infera.server.metrics import ServerMetrics
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
