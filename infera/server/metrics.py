"""Prometheus metrics of one frontend: request histograms, and fleet/router state read at scrape time."""

from __future__ import annotations

import dataclasses
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.values import MutexValue

from infera.router.router import Router
from infera.router.view import OVERLAP_BUCKETS
from infera.server.tally import Usage

M = TypeVar("M", Counter, Histogram)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class ServerMetrics:
    """One registry per app (no globals), so tests and several apps in one process never collide."""

    def __init__(self, router: Router) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("infera_requests", "Requests by endpoint and HTTP status",
                                ["endpoint", "status"], registry=self.registry)
        self.ttft = Histogram("infera_time_to_first_token_seconds", "Arrival to first response byte sent",
                              ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("infera_inter_token_latency_seconds", "Gap between streamed chunks",
                             ["endpoint"], buckets=ITL_BUCKETS, registry=self.registry)
        self.e2e = Histogram("infera_request_duration_seconds", "Arrival to last byte",
                             ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.tokens = Counter("infera_tokens", "Tokens by endpoint and kind (prompt, completion, cached prompt), "
                              "as the workers' usage objects report them", ["endpoint", "kind"],
                              registry=self.registry)
        self.registry.register(_RouterCollector(router))
        self._children: dict[tuple[int, tuple[str, ...]], Counter | Histogram] = {}
        self._endpoints: dict[str, EndpointAccounts] = {}
        self._fast: dict[tuple[int, tuple[str, ...]], Callable[[float], None]] = {}  # observer() and counter()
        self._buckets: dict[tuple[int, tuple[str, ...]], Buckets] = {}

    def of(self, metric: M, *labels: str) -> M:
        """``metric.labels(*labels)``, remembered: ``labels()`` takes a lock and builds its key each
        call (~5 µs), and a request records four to six of them."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child  # type: ignore[return-value]  # the key's metric made it

    def observer(self, metric: Histogram, *labels: str) -> Callable[[float], None]:
        """``self.of(metric, *labels).observe``, without its per-call checks (see :func:`fast_observe`); made
        once per child."""
        key = (id(metric), labels)
        observe = self._fast.get(key)
        if observe is None:
            observe = self._fast[key] = fast_observe(self.of(metric, *labels))
        return observe

    def buckets(self, metric: Histogram, *labels: str) -> Buckets | None:
        """``self.of(metric, *labels)``'s bounds and many observations' counts added at once (see
        :func:`fast_buckets`); made once per child."""
        key = (id(metric), labels)
        buckets = self._buckets.get(key)
        if buckets is None:
            buckets = fast_buckets(self.of(metric, *labels))
            if buckets is None:
                return None
            self._buckets[key] = buckets
        return buckets

    def counter(self, metric: Counter, *labels: str) -> Callable[[float], None]:
        """``self.of(metric, *labels).inc`` for amounts >= 0, without its per-call checks (see
        :func:`fast_inc`); made once per child."""
        key = (id(metric), labels)
        inc = self._fast.get(key)
        if inc is None:
            inc = self._fast[key] = fast_inc(self.of(metric, *labels))
        return inc

    def accounts(self, endpoint: str) -> EndpointAccounts:
        """``endpoint``'s end-of-request accounting (made once per endpoint)."""
        accounts = self._endpoints.get(endpoint)
        if accounts is None:
            accounts = self._endpoints[endpoint] = EndpointAccounts(self, endpoint)
        return accounts


def fast_inc(child: Counter) -> Callable[[float], None]:
    """A labelled counter child's ``inc``, for amounts >= 0 (a token count, a request): its value's own ``inc``,
    the same lock and the same sum, without ``Counter.inc``'s two frames of checks per call (that the child is
    observable, which a child is, and that the amount is not negative). The public ``inc`` where this
    prometheus_client keeps its value elsewhere."""
    value = getattr(child, "_value", None)
    inc = getattr(value, "inc", None)
    return inc if callable(inc) else child.inc


def _mutex(value: object) -> MutexValue | None:
    """``value`` when it is prometheus_client's in-process value (a float under its own lock, which its ``inc``
    adds to), so that a caller may do what ``inc`` does without its frame; None otherwise (multiprocess mode's
    values, another prometheus_client), where the caller keeps ``inc``."""
    return value if type(value) is MutexValue else None


def fast_observe(child: Histogram) -> Callable[[float], None]:
    """A labelled histogram child's ``observe``: the same sum and the same bucket (the first bound >= the
    amount; none for NaN), found by bisection instead of ``observe``'s loop and without its check frames (the
    child is observable), each added under its value's own lock as the value's ``inc`` does, in one frame (the
    values' ``inc`` where this prometheus_client keeps them elsewhere). The public ``observe`` where it keeps
    its buckets elsewhere."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if not (isinstance(bounds, list) and isinstance(buckets, list) and len(bounds) == len(buckets)
            and callable(getattr(total, "inc", None))):
        return child.observe
    n = len(bounds)
    values = [_mutex(bucket) for bucket in buckets]
    mutex = _mutex(total)
    if mutex is not None and all(v is not None for v in values):
        sums = mutex
        counts = cast(list[MutexValue], values)

        def observe(amount: float) -> None:
            with sums._lock:
                sums._value += amount
            i = bisect_left(bounds, amount)
            if i < n and amount <= bounds[i]:  # NaN: bisect says 0, and no bound holds it (as in observe's loop)
                count = counts[i]
                with count._lock:
                    count._value += 1
        return observe
    add = total.inc  # type: ignore[union-attr]
    incs = [bucket.inc for bucket in buckets]

    def observe_inc(amount: float) -> None:
        add(amount)
        i = bisect_left(bounds, amount)
        if i < n and amount <= bounds[i]:
            incs[i](1)
    return observe_inc


@dataclasses.dataclass(frozen=True, slots=True)
class Buckets:
    """A histogram child's upper bounds (ascending, the last +Inf) and ``add(counts, total)``: what
    observations falling ``counts[i]`` in bucket ``i`` (the first bound >= the amount) and summing to ``total``
    add to it, at once (the relay's C sink counts a stream's gaps so, csrc/splice.c)."""

    bounds: list[float]
    add: Callable[[list[int], float], None]


def fast_buckets(child: Histogram) -> Buckets | None:
    """:class:`Buckets` of a labelled histogram child, each value added under its own lock as its ``inc`` does
    (its ``inc`` where this prometheus_client keeps them elsewhere); None where it keeps its buckets elsewhere."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if not (isinstance(bounds, list) and isinstance(buckets, list) and len(bounds) == len(buckets)
            and callable(getattr(total, "inc", None))):
        return None
    values = [_mutex(bucket) for bucket in buckets]
    mutex = _mutex(total)
    if mutex is not None and all(v is not None for v in values):
        sums = mutex
        counts = cast(list[MutexValue], values)

        def add(added: list[int], amount: float) -> None:
            with sums._lock:
                sums._value += amount
            for count, n in zip(counts, added, strict=True):
                if n:
                    with count._lock:
                        count._value += n
        return Buckets([float(b) for b in bounds], add)
    add_sum = total.inc  # type: ignore[union-attr]
    incs = [bucket.inc for bucket in buckets]

    def add_inc(added: list[int], amount: float) -> None:
        add_sum(amount)
        for inc, n in zip(incs, added, strict=True):
            if n:
                inc(n)
    return Buckets([float(b) for b in bounds], add_inc)


class EndpointAccounts:
    """One endpoint's end-of-request observations with their label children's methods held, so that a
    request pays neither ``labels()`` nor :meth:`ServerMetrics.of`'s key and lookup for each of its four to
    six. A child is bound when first used, not before: a child is a series in /metrics from when it is made
    (at 0), so binding ahead would add series that no request observed."""

    __slots__ = ("_cached", "_e2e", "_endpoint", "_metrics", "_statuses", "_tokens", "_ttft")

    def __init__(self, metrics: ServerMetrics, endpoint: str) -> None:
        self._metrics = metrics
        self._endpoint = endpoint
        self._statuses: dict[str, Count] = {}  # status -> its requests child's value (or inc)
        self._ttft: Callable[[float], None] | None = None
        self._e2e: Callable[[float], None] | None = None
        self._tokens: tuple[Count, Count] | None = None  # prompt, completion
        self._cached: Callable[[float], None] | None = None

    def record(self, status: str, started: float, ttft: float | None, usage: Usage | None) -> None:
        """A request's end: its time to first byte (when recorded now), its status, its duration since
        ``started`` (``time.perf_counter()``) and its usage's token counts; the same observations, in the
        same order, as one :meth:`ServerMetrics.of` call each. A counter's value is added to under its lock, as
        its ``inc`` does (:func:`_counter`, :func:`_inc`), without prometheus_client's frames."""
        metrics, endpoint = self._metrics, self._endpoint
        if ttft is not None:
            if self._ttft is None:
                self._ttft = metrics.observer(metrics.ttft, endpoint)
            self._ttft(ttft)
        count = self._statuses.get(status)
        if count is None:
            count = self._statuses[status] = _counter(metrics.of(metrics.requests, endpoint, status))
        _inc(count, 1)
        if self._e2e is None:
            self._e2e = metrics.observer(metrics.e2e, endpoint)
        self._e2e(time.perf_counter() - started)
        if usage is not None:
            if self._tokens is None:
                tokens = metrics.tokens
                self._tokens = (_counter(metrics.of(tokens, endpoint, "prompt")),  # counts are >= 0 (tally reads
                                _counter(metrics.of(tokens, endpoint, "completion")))  # digits)
            prompt, completion = self._tokens
            _inc(prompt, usage.prompt_tokens)
            _inc(completion, usage.completion_tokens)
            if usage.cached_tokens:
                if self._cached is None:
                    self._cached = metrics.counter(metrics.tokens, endpoint, "cached")
                self._cached(usage.cached_tokens)


Count = MutexValue | Callable[[float], None]
"""A counter child as :meth:`EndpointAccounts.record` adds to it: its in-process value, or its ``inc``."""


def _counter(child: Counter) -> Count:
    """``child``'s value where it is prometheus_client's in-process one (:func:`_mutex`), else :func:`fast_inc`'s."""
    value = _mutex(getattr(child, "_value", None))
    return value if value is not None else fast_inc(child)


def _inc(count: Count, amount: float) -> None:
    """``amount`` added to ``count``: under the in-process value's lock, as its ``inc`` does, or by its ``inc``."""
    if isinstance(count, MutexValue):
        with count._lock:
            count._value += amount
    else:
        count(amount)


class _RouterCollector(Collector):
    def __init__(self, router: Router) -> None:
        self._router = router

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        view = self._router.view
        workers = view.workers()
        fleet = GaugeMetricFamily("infera_fleet_workers", "Routable workers by role", labels=["role"])
        for role in ("mixed", "prefill", "decode"):
            fleet.add_metric([role], sum(1 for w in workers if w.record.role == role))
        yield fleet

        in_flight = GaugeMetricFamily("infera_worker_in_flight", "Requests in flight per worker", labels=["worker"])
        blocks = GaugeMetricFamily("infera_kv_indexed_blocks", "KV blocks the router believes each worker holds",
                                   labels=["worker"])
        stale = GaugeMetricFamily("infera_kv_events_stale",
                                  "1 when a worker's KV events are missing or stale and its cache is predicted",
                                  labels=["worker"])
        cooling = GaugeMetricFamily("infera_worker_cooldown_seconds", "Seconds a failed worker is avoided for",
                                    labels=["worker"])
        for w in workers:
            wid = [w.record.instance_id]
            in_flight.add_metric(wid, w.in_flight)
            blocks.add_metric(wid, w.kv_blocks_indexed)
            stale.add_metric(wid, 1.0 if w.kv_events_stale else 0.0)
            cooling.add_metric(wid, w.cooldown_seconds)
        yield in_flight
        yield blocks
        yield stale
        yield cooling

        stats = view.stats()
        batches = CounterMetricFamily("infera_kv_event_batches", "KV-event batches received", labels=["worker"])
        for wid_, n in sorted(stats.kv_batches.items()):
            batches.add_metric([wid_], n)
        yield batches
        gaps = CounterMetricFamily("infera_kv_event_gaps", "KV-event batches lost for good", labels=["worker"])
        for wid_, n in sorted(stats.kv_gaps.items()):
            gaps.add_metric([wid_], n)
        yield gaps

        decisions = CounterMetricFamily("infera_routing_decisions", "Routing decisions by policy and reason",
                                        labels=["policy", "reason"])
        for (policy, reason), n in sorted(stats.decisions.items()):
            decisions.add_metric([policy, reason], n)
        yield decisions
        yield CounterMetricFamily("infera_request_retries", "Attempts on an alternate worker", value=stats.retries)

        overlap = HistogramMetricFamily("infera_routed_prompt_overlap_fraction",
                                        "Fraction of a routed prompt's blocks cached on the chosen worker")
        overlap.add_metric([], [(_bound(b), float(n)) for b, n in zip(OVERLAP_BUCKETS, stats.overlap_buckets,
                                                                        strict=True)]
                           + [("+Inf", float(stats.overlap_count))], stats.overlap_sum)
        yield overlap


def _bound(value: float) -> str:
    return repr(float(value))
