"""Prometheus metrics of the endpoint picker: picks by outcome, pick latency, load in flight."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PICK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class PickerMetrics:
    """One registry per picker (no globals), so several pickers in one process never collide."""

    def __init__(self, in_flight: Callable[[], float], workers: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.picks = Counter("infera_picker_picks", "Requests the picker answered, by outcome (placed, "
                             "passthrough, unavailable, refused, bad_request)", ["outcome"], registry=self.registry)
        self.pick_seconds = Histogram("infera_picker_pick_seconds", "Time to place one request",
                                      buckets=PICK_BUCKETS, registry=self.registry)
        self.streams = Gauge("infera_picker_streams", "ext_proc streams open (HTTP requests in the gateway)",
                             registry=self.registry)
        in_flight_gauge = Gauge("infera_picker_in_flight", "Requests placed whose response has not ended",
                                registry=self.registry)
        in_flight_gauge.set_function(in_flight)
        workers_gauge = Gauge("infera_picker_workers", "Workers in the picker's fleet view", registry=self.registry)
        workers_gauge.set_function(workers)
