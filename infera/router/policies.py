"""Policies by name: adding one is one module and one line here."""

from __future__ import annotations

from infera.router.base import PolicyFactory
from infera.router.kv_aware import KvAwarePolicy
from infera.router.round_robin import RoundRobinPolicy

POLICIES: dict[str, PolicyFactory] = {
    "kv-aware": KvAwarePolicy,
    "round-robin": RoundRobinPolicy,
}
