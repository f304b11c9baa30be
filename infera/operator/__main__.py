"""``python -m infera.operator``: reconcile InferaFleets into worker pods, frontends and GAIE wiring."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

import kopf

from infera.config import load
from infera.config.operator import OperatorSettings
from infera.operator.handlers import build_registry


def main(argv: Sequence[str] | None = None) -> int:
    settings = load(OperatorSettings, argv, prog="python -m infera.operator",
                    description="infera operator: InferaFleet -> worker Deployments, frontends, GAIE objects")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = build_registry(settings)
    liveness = f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None
    asyncio.run(kopf.operator(
        registry=registry, standalone=True, liveness_endpoint=liveness,
        clusterwide=not settings.namespace, namespaces=[settings.namespace] if settings.namespace else [],
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
