"""A worker's side of discovery: pick the registrar for ``--discovery-backend``, and serve an
in-process engine (the mock) so that SIGTERM deregisters first, then drains, then stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from infera.config.worker import WorkerFleetSettings
from infera.discovery.base import Registrar
from infera.discovery.etcd_registrar import EtcdRegistrar
from infera.discovery.kubernetes_registrar import PodAnnotationRegistrar
from infera.protocols.worker import WorkerRecord

log = logging.getLogger(__name__)

# Routers apply a deletion within milliseconds of etcd; this margin covers a request they
# dispatched just before, which must still be accepted and served.
DEREGISTER_MARGIN = 0.3


def etcd_registrar(settings: WorkerFleetSettings) -> Registrar:
    return EtcdRegistrar(settings.etcd_endpoint, ttl=settings.lease_ttl)


def pod_annotation_registrar(settings: WorkerFleetSettings) -> Registrar:
    return PodAnnotationRegistrar(kubeconfig=settings.kubeconfig)


# One factory per --discovery-backend whose workers publish themselves; static needs none
# (routers read GET /infera/worker).
REGISTRARS: dict[str, Callable[[WorkerFleetSettings], Registrar]] = {
    "etcd": etcd_registrar,
    "kubernetes": pod_annotation_registrar,
}

def check_available(settings: WorkerFleetSettings) -> None:
    """Fail fast when a NATS transport has no broker to talk to."""
    for field in ("request_transport", "kv_event_transport"):
        if getattr(settings, field) == "nats" and not settings.nats_server:
            flag = "--" + field.replace("_", "-")
            raise ValueError(f"{flag} nats needs the broker's address: --nats-server nats://HOST:4222 (env "
                             "NATS_SERVER or NATS_URL); without a broker use --request-transport http "
                             "--kv-event-transport zmq")


def make_registrar(settings: WorkerFleetSettings) -> Registrar | None:
    factory = REGISTRARS.get(settings.discovery_backend)
    return factory(settings) if factory else None


class RegisteredServer(uvicorn.Server):
    """A uvicorn server that publishes ``record`` once it listens.

    On the first SIGTERM/SIGINT it deregisters, waits :data:`DEREGISTER_MARGIN`, then lets
    uvicorn's graceful shutdown drain in-flight requests (``timeout_graceful_shutdown``); a
    second signal skips the wait. The record is also removed when the server stops for any
    other reason.
    """

    def __init__(self, config: uvicorn.Config, registrar: Registrar, record: WorkerRecord) -> None:
        super().__init__(config)
        self.registrar = registrar
        self.record = record
        self._loop: asyncio.AbstractEventLoop | None = None
        self._leaving = False
        self._registered = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and not self.should_exit:
            await self.registrar.register(self.record)
            self._registered = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._leaving or self._loop is None or not self._registered:
            super().handle_exit(sig, frame)
            return
        self._leaving = True
        log.info("%s: deregistering, then draining for up to %ss", signal.Signals(sig).name,
                 self.config.timeout_graceful_shutdown)
        self._loop.call_soon_threadsafe(self._spawn_leave, sig)

    def _spawn_leave(self, sig: int) -> None:
        task = asyncio.ensure_future(self._leave(sig))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _leave(self, sig: int) -> None:
        try:
            await self._deregister()
            await asyncio.sleep(DEREGISTER_MARGIN)
        finally:
            super().handle_exit(sig, None)

    async def _deregister(self) -> None:
        if self._registered:
            self._registered = False
            await self.registrar.deregister()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._deregister()
        await super().shutdown(sockets)
