"""Roles by name (``--role``): adding one is one module and one line here."""

from __future__ import annotations

from collections.abc import Callable

from infera.config.engine import MockEngineSettings
from infera.engine.mock.cache import BlockPool
from infera.engine.mock.pd import DecodeRole, PrefillRole
from infera.engine.mock.role import MixedRole, Role
from infera.protocols.worker import WorkerRecord

RoleFactory = Callable[[MockEngineSettings, BlockPool, WorkerRecord, str], Role]

ROLES: dict[str, RoleFactory] = {
    "mixed": lambda settings, pool, record, host: MixedRole(),
    "prefill": PrefillRole,
    "decode": DecodeRole,
}


def make_role(settings: MockEngineSettings, pool: BlockPool, record: WorkerRecord, host: str) -> Role:
    """The role of ``settings.role``; ``host`` is the address the worker advertises."""
    return ROLES[settings.role](settings, pool, record, host)
