"""bench/promql_eval.py against values computed by hand, and over every query of the dashboard."""

from __future__ import annotations

import math

import pytest

from bench.promql_eval import Store, Unsupported, bucket_quantile, evaluate
from tests.deploy.test_grafana_dashboard import GRAFANA_VARS, load_dashboard, queries

FRONTEND = {"job": "infera", "instance": "fe:1"}


def exposition(requests: dict[tuple[str, str], float], in_flight: dict[str, float],
               buckets: dict[str, float] | None = None) -> str:
    lines = ["# TYPE infera_requests counter"]
    lines += [f'infera_requests_total{{endpoint="{e}",status="{s}"}} {v}' for (e, s), v in requests.items()]
    lines += ["# TYPE infera_worker_in_flight gauge"]
    lines += [f'infera_worker_in_flight{{worker="{w}"}} {v}' for w, v in in_flight.items()]
    if buckets is not None:
        lines += ["# TYPE ttft histogram"]
        lines += [f'ttft_bucket{{le="{le}"}} {v}' for le, v in buckets.items()]
        lines += [f"ttft_sum {sum(buckets.values())}", f"ttft_count {buckets['+Inf']}"]
    return "\n".join(lines) + "\n"


def value(store: Store, expr: str, t: float) -> float:
    result = evaluate(expr, store, t)
    if isinstance(result, float):
        return result
    assert len(result) == 1, result
    return next(iter(result.values()))


@pytest.fixture
def store() -> Store:
    """Chat 200s count 10, 20, 5 (the frontend restarted), 15; chat 500s 0, 1, 1, 3; t = 0, 10, 20, 30."""
    s = Store()
    for t, ok, err in [(0, 10, 0), (10, 20, 1), (20, 5, 1), (30, 15, 3)]:
        s.add(t, FRONTEND, exposition({("chat", "200"): ok, ("chat", "500"): err},
                                      {"w1": t / 10, "w2": 2.0}))
    return s


def test_rate_and_increase_count_a_counter_reset_as_the_new_value(store: Store) -> None:
    # 10 -> 20 (+10), 20 -> 5 (a reset: +5), 5 -> 15 (+10): 25 over 30 s
    assert value(store, 'increase(infera_requests_total{status="200"}[1m])', 30) == 25
    assert value(store, 'rate(infera_requests_total{status="200"}[1m])', 30) == pytest.approx(25 / 30)
    # the window is (t - 15 s, t]: only the samples at 20 and 30
    assert value(store, 'rate(infera_requests_total{status="200"}[15s])', 30) == pytest.approx(1.0)
    assert value(store, 'irate(infera_requests_total{status="200"}[1m])', 20) == pytest.approx(0.5)
    assert evaluate('rate(infera_requests_total{status="200"}[5s])', store, 30) == {}, "one sample has no rate"


def test_aggregation_matchers_and_arithmetic(store: Store) -> None:
    by_status = evaluate("sum by (status) (rate(infera_requests_total[1m]))", store, 30)
    assert by_status == {(("status", "200"),): pytest.approx(25 / 30), (("status", "500"),): pytest.approx(0.1)}
    ratio = ('sum(rate(infera_requests_total{status=~"5.."}[1m])) '
             '/ clamp_min(sum(rate(infera_requests_total{job=~".*"}[1m])), 1e-9)')
    assert value(store, ratio, 30) == pytest.approx(3 / 28)
    assert value(store, 'sum(rate(infera_requests_total{status!~"5.."}[1m])) * 60', 30) == pytest.approx(50)
    assert value(store, "max(infera_worker_in_flight)", 30) == 3
    assert value(store, "avg(infera_worker_in_flight)", 10) == 1.5
    per_worker = evaluate("sum by (worker) (infera_worker_in_flight) - 1", store, 20)
    assert per_worker == {(("worker", "w1"),): 1.0, (("worker", "w2"),): 1.0}
    assert value(store, "count without (worker) (infera_worker_in_flight)", 0) == 2
    assert value(store, "-(2 + 3) / 5", 0) == -1
    assert evaluate("infera_worker_in_flight / infera_worker_in_flight", store, 30) == {
        (("instance", "fe:1"), ("job", "infera"), ("worker", "w1")): 1.0,
        (("instance", "fe:1"), ("job", "infera"), ("worker", "w2")): 1.0}
    assert value(store, "sum(infera_worker_in_flight) / 0", 0) == math.inf


def test_a_series_ends_when_its_target_stops_answering(store: Store) -> None:
    store.add(40, FRONTEND, None)
    assert evaluate("infera_worker_in_flight", store, 35) != {}
    assert evaluate("infera_worker_in_flight", store, 40) == {}
    assert value(store, 'increase(infera_requests_total{status="200"}[1m])', 45) == 25, "stale markers are no samples"
    store.add(50, FRONTEND, exposition({("chat", "200"): 1}, {}))
    assert evaluate('infera_requests_total{status="500"}', store, 50) == {}
    assert value(store, 'infera_requests_total{status="200"}', 50) == 1


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)]
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)  # rank 20 in (0.1, 0.5]
    assert bucket_quantile(0.25, buckets) == pytest.approx(0.1)  # rank 10: the first bucket's top
    assert bucket_quantile(0.1, buckets) == pytest.approx(0.04)  # rank 4 in (0, 0.1]
    assert bucket_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0  # in +Inf: the highest finite bound
    assert math.isnan(bucket_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]))
    assert math.isnan(bucket_quantile(0.5, [(1.0, 3.0)])), "no +Inf bucket"
    s = Store()
    s.add(0, FRONTEND, exposition({}, {}, {"0.1": 0, "0.5": 0, "1.0": 0, "+Inf": 0}))
    s.add(10, FRONTEND, exposition({}, {}, {"0.1": 10, "0.5": 30, "1.0": 40, "+Inf": 40}))
    expr = "histogram_quantile(0.5, sum by (le) (rate(ttft_bucket[1m])))"
    assert evaluate(expr, s, 10) == {(): pytest.approx(0.3)}


def test_unsupported_constructs_say_so(store: Store) -> None:
    with pytest.raises(Unsupported, match="operator"):
        evaluate("infera_worker_in_flight > 1", store, 0)
    with pytest.raises(Unsupported, match="function"):
        evaluate("delta(infera_worker_in_flight[1m])", store, 0)
    with pytest.raises(Unsupported, match="binary modifiers"):
        evaluate("infera_worker_in_flight / on (worker) infera_worker_in_flight", store, 0)


def test_every_dashboard_query_evaluates(store: Store) -> None:
    for title, expr in queries(load_dashboard()):
        if title.startswith("variable "):
            continue
        for var, sub in GRAFANA_VARS.items():
            expr = expr.replace(var, sub)
        assert isinstance(evaluate(expr, store, 30), dict), title
