"""The engine-adapter seam: what a worker wrapper must know about one engine.

An adapter is pure: it builds the engine's command line from the wrapper's settings, reads
the engine's own info endpoints into :class:`EngineInfo`, and counts in-flight requests
from its metrics (for the drain on SIGTERM). Launching, health waits, registration and
signals belong to :mod:`infera.engine.wrapper`, the same for every engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

from infera.config.worker import WorkerSettings

Fetch = Callable[[str], Awaitable[str | None]]
"""GET a path of the engine's HTTP API (e.g. ``/metrics``); its body, or None if it failed or is not 200."""


@dataclasses.dataclass(frozen=True)
class EnginePorts:
    """Where the engine listens: its HTTP API, and (when KV events are on) its event and replay sockets."""

    http: int
    kv_events: int | None = None
    kv_replay: int | None = None


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What the engine says about itself; 0 / empty = it did not say."""

    model: str = ""
    block_size: int = 0
    kv_blocks: int = 0
    max_num_seqs: int = 0


class EngineAdapter(Protocol):
    name: str
    """The engine's name in the worker record (``vllm``, ``sglang``...)."""

    publishes_kv_events: bool
    """Whether :meth:`command` switches the engine's ZMQ KV-event publisher on."""

    connector: str
    """How a prefill worker of this engine hands its KV to the decode worker (the record's
    ``connector`` for ``--role prefill|decode``): ``push`` (SGLang bootstrap rooms) or ``pull``
    (vLLM NIXL ``kv_transfer_params``)."""

    def command(self, settings: WorkerSettings, ports: EnginePorts) -> list[str]:
        """The full argv that starts the engine in ``settings.role`` (without the user's extra engine args)."""
        ...

    async def info(self, fetch: Fetch) -> EngineInfo:
        """Read block size, capacity and model from the running engine's endpoints."""
        ...

    def in_flight(self, metrics: str) -> int | None:
        """Requests running or queued, from a ``/metrics`` body; None if the body does not say."""
        ...


def kv_events_config(ports: EnginePorts, topic: str, *, with_flag: bool = True) -> dict[str, object]:
    """vLLM's (and SGLang's) ``--kv-events-config`` for a ZMQ publisher that binds ``tcp://*:<port>``.

    A ``tcp://host:port`` endpoint would make the engine *connect* instead of bind; ``*``
    binds every interface, and the wrapper advertises the address routers should use.
    """
    config: dict[str, object] = {"publisher": "zmq", "endpoint": f"tcp://*:{ports.kv_events}", "topic": topic}
    if with_flag:
        config["enable_kv_cache_events"] = True
    if ports.kv_replay:
        config["replay_endpoint"] = f"tcp://*:{ports.kv_replay}"
    return config


def prometheus_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric ``name`` (labels, value) in a Prometheus text exposition."""
    try:
        return [(dict(sample.labels), float(sample.value))
                for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.name == name]
    except ValueError:  # a line the parser rejects: treat the body as saying nothing
        return []


def sum_gauges(text: str, names: Sequence[str]) -> int | None:
    """The sum of every sample of ``names``; None if none of them appears."""
    found = False
    total = 0.0
    for name in names:
        for _, value in prometheus_samples(text, name):
            found = True
            total += value
    return round(total) if found else None
