"""One entry point over the builders: an InferaFleet -> every child object that should exist."""

from __future__ import annotations

from typing import Any

from infera.operator.builders import (
    Owner,
    frontend_deployment,
    frontend_service_object,
    rbac,
    worker_deployment,
)
from infera.operator.gaie import gaie_objects
from infera.operator.spec import FleetSpec


def build_children(owner: Owner, spec: FleetSpec) -> list[dict[str, Any]]:
    """Everything that should exist for this fleet, each stamped with its spec hash.

    Raises :class:`~infera.config.base.ConfigError` when the spec renders settings a frontend or
    worker would refuse at start.
    """
    objects = rbac(owner)
    for role, pool in spec.pools.items():
        objects.append(worker_deployment(owner, spec, role, pool))
    if spec.gaie.enabled:
        objects += gaie_objects(owner, spec)
    else:
        objects += [frontend_deployment(owner, spec), frontend_service_object(owner)]
    return objects
