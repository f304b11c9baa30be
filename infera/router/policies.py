"""Policies by name: adding one is one module and one line here."""

from __future__ import annotations

from infera.router.approx_prefix import ApproxPrefixPolicy
from infera.router.base import PolicyFactory
from infera.router.kv_aware import KvAwarePolicy
from infera.router.kv_evict import KvEvictPolicy
from infera.router.kv_ttft import (
    KvTtftBusyPolicy,
    KvTtftColdPolicy,
    KvTtftEvictionPolicy,
    KvTtftHoldPolicy,
    KvTtftOccupancyPolicy,
    KvTtftOnlyPolicy,
    KvTtftPolicy,
)
from infera.router.least_load import LeastLoadPolicy
from infera.router.round_robin import RoundRobinPolicy

POLICIES: dict[str, PolicyFactory] = {
    "kv-aware": KvEvictPolicy,  # predicted time to first token, evictions priced by recency (chosen by measurement:
    # bench/README.md, "Seventh round")
    "kv-aware-flat": KvTtftPolicy,  # the same with every evicted block priced alike (the default before)
    "kv-aware-busy": KvTtftBusyPolicy,  # kv-aware-flat, its occupancy weight rising while the fleet computes prompts
    "kv-aware-hold": KvTtftHoldPolicy,  # kv-aware-busy, and a prefix holder's queue counts what it computed (candidate)
    "kv-aware-cold": KvTtftColdPolicy,  # a prompt nothing caches waits for the next step, no horizon (candidate)
    "kv-aware-occupancy": KvTtftOccupancyPolicy,  # the same without the stay floor (the default before)
    "kv-aware-eviction": KvTtftEvictionPolicy,  # the same without the occupancy term either (the default before that)
    "kv-aware-ttft": KvTtftOnlyPolicy,  # without the eviction term either (the default before kv-aware-eviction)
    "kv-aware-blocks": KvAwarePolicy,  # the previous cost: blocks of prefill left + blocks held in flight
    "round-robin": RoundRobinPolicy,
    "least-load": LeastLoadPolicy,  # the decode leg of a prefill/decode pair
    "approx-prefix": ApproxPrefixPolicy,  # sglang-router cache_aware's approximate tree: no KV events needed
}

DECODE_ONLY = frozenset({"least-load"})  # registered for the decode leg of a pair, not a --router-policy


def selectable() -> tuple[str, ...]:
    """The ``--router-policy`` choices: every registered policy but the decode leg's."""
    return tuple(name for name in POLICIES if name not in DECODE_ONLY)
