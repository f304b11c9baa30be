"""``python -m infera.picker``: the GAIE endpoint picker (ext_proc v3 over gRPC, health, /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop
from grpclib.server import Server
from prometheus_client import start_http_server

from infera.config import load
from infera.config.base import ConfigError
from infera.config.picker import PickerSettings
from infera.picker.health import Health
from infera.picker.metrics import PickerMetrics
from infera.picker.placement import Placer
from infera.picker.service import ExtProc, Targets
from infera.router.assembly import assemble
from infera.telemetry.setup import build_telemetry, configure_logging

log = logging.getLogger("infera.picker")


async def serve(settings: PickerSettings) -> None:
    parts = assemble(settings)
    placer = Placer(parts.router)
    metrics = PickerMetrics(lambda: placer.in_flight(), lambda: len(placer.workers()))
    service = ExtProc(placer, Targets(settings.target_port), metrics, header=settings.destination_header,
                      namespace=settings.metadata_namespace, subset_namespace=settings.subset_namespace,
                      fallbacks=settings.fallback_endpoints, strip=settings.strip_prompt_pattern,
                      telemetry=build_telemetry(settings.otel_exporter, settings.log_requests, settings.log_format,
                                                "infera-picker"))
    started = False
    server = Server([service, Health(lambda: started)])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for hook in parts.on_start:
        await hook()
    started = True
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.host, registry=metrics.registry)
    await server.start(settings.host, settings.port)
    log.info("endpoint picker on %s:%d (gRPC), metrics on :%d", settings.host, settings.port, settings.metrics_port)
    try:
        await stop.wait()
    finally:
        server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 5)
        for hook in parts.on_stop:
            await hook()


def main(argv: Sequence[str] | None = None) -> int:
    settings = load(PickerSettings, argv, prog="python -m infera.picker",
                    description="infera endpoint picker: the KV-aware router behind a GAIE gateway (Envoy ext_proc)")
    configure_logging(settings.log_level, settings.log_format)
    try:
        uvloop.run(serve(settings))
    except (ConfigError, ValueError, OSError) as exc:
        print(f"infera.picker: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
