"""Policies by name: adding one is one module and one line here."""

from __future__ import annotations

from infera.router.base import PolicyFactory
from infera.router.kv_aware import KvAwarePolicy
from infera.router.least_load import LeastLoadPolicy
from infera.router.round_robin import RoundRobinPolicy

POLICIES: dict[str, PolicyFactory] = {
    "kv-aware": KvAwarePolicy,
    "round-robin": RoundRobinPolicy,
    "least-load": LeastLoadPolicy,  # the decode leg of a prefill/decode pair
}

DECODE_ONLY = frozenset({"least-load"})  # registered for the decode leg of a pair, not a --router-policy


def selectable() -> tuple[str, ...]:
    """The ``--router-policy`` choices: every registered policy but the decode leg's."""
    return tuple(name for name in POLICIES if name not in DECODE_ONLY)
