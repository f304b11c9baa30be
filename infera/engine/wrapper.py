"""The worker wrapper shared by every real engine: ``python -m infera.engine.<engine> [flags] [-- engine flags]``.

It launches the engine as a child (its command from the engine's :class:`EngineAdapter`,
KV-event publisher on and bound where the wrapper chose) or attaches to one already
serving (``--engine-url``), waits for ``GET /health``, reads what the engine says about
itself, publishes the worker record (``--discovery-backend etcd``) and then:

- on SIGTERM/SIGINT: deregisters first (routers stop sending), waits for in-flight
  requests to finish (counted from the engine's metrics) for up to ``--drain-seconds``,
  then forwards the signal to the engine and exits with the engine's exit code; a second
  signal skips the drain;
- when the engine exits by itself: deregisters and exits with its code;
- attached: deregisters while the engine fails its health checks, registers again when it
  is back.

The engine runs in its own session (a terminal's Ctrl-C reaches the wrapper only, which
decides when the engine hears it) and receives SIGTERM if the wrapper dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import shlex
import signal
import socket
import sys
import time
from collections.abc import Sequence

import aiohttp

from infera.config import load
from infera.config.worker import WorkerSettings
from infera.discovery.base import Registrar
from infera.engine.base import EngineAdapter, EngineInfo, EnginePorts
from infera.engine.nats_bridge import bridge_for, with_nats_subjects
from infera.engine.registration import DEREGISTER_MARGIN, check_available, make_registrar
from infera.protocols.worker import Capacity, KvEventEndpoint, WorkerRecord

log = logging.getLogger("infera.engine.wrapper")

STOP_TIMEOUT = 30.0  # seconds the engine gets to exit after the forwarded signal, before SIGKILL
HEALTH_PERIOD = 2.0  # attached: seconds between health checks
UNHEALTHY_AFTER = 3  # attached: failed checks before the worker is deregistered
FETCH_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def advertised_host(settings: WorkerSettings) -> str:
    if settings.advertise_host:
        return settings.advertise_host
    return "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host


def exit_code(returncode: int) -> int:
    """A child's return code as a shell would report it (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)


def build_record(adapter: EngineAdapter, settings: WorkerSettings, http_url: str, ports: EnginePorts,
                 info: EngineInfo, served: WorkerRecord | None = None) -> WorkerRecord:
    """The record routers need. Flags win over what the engine says; 0 / empty means "ask the engine"."""
    host = advertised_host(settings)
    kv_events = None
    # On NATS too the record keeps the engine's ZMQ endpoints: the wrapper's relay reads them.
    if ports.kv_events and settings.kv_event_transport in ("zmq", "nats"):
        kv_events = KvEventEndpoint(endpoint=f"tcp://{host}:{ports.kv_events}",
                                    replay_endpoint=f"tcp://{host}:{ports.kv_replay}" if ports.kv_replay else None,
                                    topic=settings.kv_events_topic)
    elif served is not None and settings.kv_event_transport in ("zmq", "nats"):
        kv_events = served.kv_events
    block_size = settings.block_size or info.block_size or (served.kv_block_size if served else 0) or 16
    kv_blocks = settings.num_kv_blocks or info.kv_blocks or (served.capacity.kv_blocks if served else 0)
    max_seqs = settings.max_num_seqs or info.max_num_seqs or (served.capacity.max_num_seqs if served else 0)
    model = settings.served_model_name or info.model or (served.model if served else "") or settings.model_path
    port = http_url.rstrip("/").rsplit(":", 1)[-1]
    connector = adapter.connector if settings.role != "mixed" else None
    bootstrap = (f"{host}:{settings.disaggregation_bootstrap_port}"
                 if settings.role == "prefill" and connector == "push" else None)
    return WorkerRecord(
        instance_id=settings.instance_id or f"{adapter.name}-{host}-{port}",
        model=model, role=settings.role, engine=adapter.name, http_url=http_url.rstrip("/"),
        kv_events=kv_events, kv_block_size=block_size,
        capacity=Capacity(kv_blocks=kv_blocks, max_num_seqs=max_seqs),
        connector=connector, bootstrap_addr=bootstrap,
    )


class Wrapper:
    def __init__(self, adapter: EngineAdapter, settings: WorkerSettings, engine_args: Sequence[str] = (),
                 registrar: Registrar | None = None) -> None:
        self.adapter = adapter
        self.settings = settings
        self.engine_args = [*shlex.split(settings.engine_args), *engine_args]
        self.registrar = registrar
        self.child: asyncio.subprocess.Process | None = None
        self.record: WorkerRecord | None = None
        self._signals: asyncio.Queue[int] = asyncio.Queue()
        self._registered = False
        self._session: aiohttp.ClientSession | None = None
        self._base = ""

    # -- the engine ----------------------------------------------------------------------

    def ports(self) -> EnginePorts:
        s = self.settings
        if s.engine_url:  # attached: we know the event ports only if told
            return EnginePorts(http=int(s.engine_url.rstrip("/").rsplit(":", 1)[-1].split("/")[0] or 80),
                               kv_events=s.kv_events_port or None, kv_replay=s.kv_replay_port or None)
        if s.kv_event_transport == "none" or not (self.adapter.publishes_kv_events or s.kv_events_port):
            return EnginePorts(http=s.port)
        return EnginePorts(http=s.port, kv_events=s.kv_events_port or free_port(),
                           kv_replay=s.kv_replay_port or free_port())

    def base_url(self, ports: EnginePorts) -> str:
        return self.settings.engine_url.rstrip("/") or f"http://{advertised_host(self.settings)}:{ports.http}"

    async def launch(self, ports: EnginePorts) -> None:
        argv = [*self.adapter.command(self.settings, ports), *self.engine_args]
        log.info("launching %s: %s", self.adapter.name, shlex.join(argv))
        self.child = await asyncio.create_subprocess_exec(*argv, start_new_session=True,
                                                          preexec_fn=_die_with_parent)

    async def fetch(self, path: str) -> str | None:
        assert self._session is not None
        try:
            async with self._session.get(self._base + path, timeout=FETCH_TIMEOUT) as resp:
                return await resp.text() if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def healthy(self) -> bool:
        return await self.fetch("/health") is not None

    async def wait_healthy(self) -> bool:
        """True once /health answers 200; False if the engine exited, a signal came, or time ran out."""
        deadline = time.monotonic() + self.settings.health_timeout
        while time.monotonic() < deadline:
            if self.child is not None and self.child.returncode is not None:
                return False
            if not self._signals.empty():
                return False
            if await self.healthy():
                return True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._signal_pending(), 0.25)
        log.error("the engine did not become healthy within %.0fs", self.settings.health_timeout)
        return False

    async def _signal_pending(self) -> None:
        sig = await self._signals.get()
        self._signals.put_nowait(sig)

    async def served_record(self) -> WorkerRecord | None:
        """The record an infera-aware engine (the mock) serves itself, if any."""
        body = await self.fetch("/infera/worker")
        if not body:
            return None
        try:
            return WorkerRecord.model_validate(json.loads(body))
        except ValueError:
            return None

    # -- registration ----------------------------------------------------------------------

    async def register(self) -> None:
        if self.registrar is not None and self.record is not None and not self._registered:
            await self.registrar.register(self.record)
            self._registered = True

    async def deregister(self) -> None:
        if self.registrar is not None and self._registered:
            self._registered = False
            await self.registrar.deregister()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signals.put_nowait, int(sig))
        ports = self.ports()
        self._base = self.base_url(ports)
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            self._session = session
            if not self.settings.engine_url:
                await self.launch(ports)
            if not await self.wait_healthy():
                return await self.stop_engine(self._first_signal() or signal.SIGTERM)
            info = await self.adapter.info(self.fetch)
            self.record = with_nats_subjects(
                build_record(self.adapter, self.settings, self._base, ports, info, await self.served_record()),
                self.settings)
            log.info("engine healthy after %.1fs; record: %s", time.monotonic() - started,
                     self.record.model_dump_json(exclude_none=True))
            # On NATS the wrapper bridges requests to its engine and relays the engine's KV events.
            bridge = bridge_for(self.record, self.settings, engine_url=self._base)
            if bridge is not None:
                try:
                    await bridge.start()
                except OSError as exc:
                    log.error("%s; stopping the engine", exc)
                    await self.stop_engine(signal.SIGTERM)
                    return 1
            try:
                await self.register()
                return await self.serve()
            finally:
                if bridge is not None:
                    await bridge.stop()

    def _first_signal(self) -> int | None:
        return None if self._signals.empty() else self._signals.get_nowait()

    async def serve(self) -> int:
        signal_wait = asyncio.ensure_future(self._signals.get())
        engine_wait = asyncio.ensure_future(self.child.wait() if self.child else self._watch_attached())
        try:
            await asyncio.wait({signal_wait, engine_wait}, return_when=asyncio.FIRST_COMPLETED)
            if engine_wait.done():
                await self.deregister()
                code = self.child.returncode if self.child else 0
                log.warning("the engine exited (%s); deregistered", code)
                return exit_code(code or 0)
            sig = signal_wait.result()
            log.info("%s: deregistering, then draining for up to %.0fs", signal.Signals(sig).name,
                     self.settings.drain_seconds)
            await self.deregister()
            await self.drain()
            return await self.stop_engine(sig)
        finally:
            for task in (signal_wait, engine_wait):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def drain(self) -> None:
        """Wait until the engine has nothing in flight, at most --drain-seconds (a second signal ends it)."""
        deadline = time.monotonic() + self.settings.drain_seconds
        await asyncio.sleep(min(DEREGISTER_MARGIN, self.settings.drain_seconds))
        while time.monotonic() < deadline:
            if not self._signals.empty() or (self.child is not None and self.child.returncode is not None):
                return
            metrics = await self.fetch("/metrics")
            busy = self.adapter.in_flight(metrics) if metrics else None
            if busy == 0:
                log.info("drained: nothing in flight")
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._signal_pending(), 0.25)
        log.warning("drain time over; stopping the engine with requests possibly in flight")

    async def stop_engine(self, sig: int) -> int:
        await self.deregister()
        if self.child is None:
            return 0
        if self.child.returncode is None:
            self.child.send_signal(sig)
            try:
                await asyncio.wait_for(self.child.wait(), STOP_TIMEOUT)
            except TimeoutError:
                log.error("the engine ignored %s for %.0fs; killing it", signal.Signals(sig).name, STOP_TIMEOUT)
                self.child.kill()
                await self.child.wait()
        code = self.child.returncode or 0
        log.info("the engine exited with %s", code)
        return exit_code(code)

    async def _watch_attached(self) -> None:
        """Attached engines: leave the fleet while unhealthy, join again when healthy. Never returns."""
        failures = 0
        while True:
            await asyncio.sleep(HEALTH_PERIOD)
            if await self.healthy():
                failures = 0
                if not self._registered:
                    log.info("the engine at %s is healthy again; registering", self._base)
                    await self.register()
                continue
            failures += 1
            if failures == UNHEALTHY_AFTER and self._registered:
                log.warning("the engine at %s failed %d health checks; deregistering", self._base, failures)
                await self.deregister()


def main(adapter: EngineAdapter, argv: Sequence[str]) -> int:
    """Run the wrapper for ``adapter``; argv after ``--`` goes to the engine unchanged."""
    args = list(argv)
    own, engine_args = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    settings = load(WorkerSettings, own, prog=f"python -m infera.engine.{adapter.name}",
                    description=f"infera worker wrapper for {adapter.name}: launch or attach, register, relay "
                                "signals. Flags after `--` go to the engine.")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_available(settings)
        registrar = make_registrar(settings)
    except ValueError as exc:
        print(f"infera.engine.{adapter.name}: error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(Wrapper(adapter, settings, engine_args, registrar).run())
