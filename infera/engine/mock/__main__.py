"""``python -m infera.engine.mock``: a simulated vLLM-like engine (see :mod:`infera.engine.mock`)."""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Sequence

import uvicorn

from infera.config import load
from infera.config.engine import MockEngineSettings
from infera.engine.mock.api import build_app
from infera.engine.mock.cache import BlockPool
from infera.engine.mock.engine import Engine
from infera.engine.mock.kvd_server import KvdServer
from infera.engine.mock.metrics import EngineMetrics
from infera.engine.mock.profiler import StepProfiler
from infera.engine.mock.publisher import KvEventPublisher
from infera.engine.mock.roles import make_role
from infera.engine.mock.scheduler import Scheduler
from infera.engine.mock.service import MockService
from infera.engine.mock.timing import StepTimeModel
from infera.engine.nats_bridge import bridge_for, serve_with_bridge, with_nats_subjects
from infera.engine.registration import RegisteredServer, check_available, make_registrar
from infera.kv.tokenizer import PromptRenderer
from infera.protocols.worker import Capacity, KvEventEndpoint, WorkerRecord

DESCRIPTION = ("A simulated LLM engine: vLLM's HTTP API, continuous batching over a paged, prefix-cached KV cache "
               "with modelled step times, and vLLM's KV events over ZMQ.")


def advertised_host(settings: MockEngineSettings) -> str:
    if settings.kv_events_host:
        return settings.kv_events_host
    return "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host


def build(settings: MockEngineSettings) -> MockService:
    """Wire everything the mock needs; nothing starts until the app's lifespan runs."""
    renderer = PromptRenderer.from_dir(settings.model_path) if settings.model_path else PromptRenderer.byte_level()
    pool = BlockPool(settings.num_kv_blocks, settings.block_size, events=settings.kv_events)
    scheduler = Scheduler(pool, settings.max_num_seqs, settings.max_num_batched_tokens)
    host = advertised_host(settings)
    publisher = None
    kv_endpoint = None
    if settings.kv_events:
        publisher = KvEventPublisher(settings.host, host, settings.kv_events_topic,
                                     port=settings.kv_events_port, replay_port=settings.kv_replay_port)
        kv_endpoint = KvEventEndpoint(endpoint=publisher.endpoint, replay_endpoint=publisher.replay_endpoint,
                                      topic=settings.kv_events_topic)
    engine = Engine(pool, scheduler, StepTimeModel.from_settings(settings),
                    EngineMetrics(settings.served_model_name), publisher)
    pd = settings.role != "mixed"
    record = WorkerRecord(
        instance_id=settings.instance_id or f"mock-{host}-{settings.port}",
        model=settings.served_model_name, role=settings.role,
        engine=settings.engine_name, http_url=f"http://{host}:{settings.port}", kv_events=kv_endpoint,
        kv_block_size=settings.block_size,
        capacity=Capacity(kv_blocks=pool.num_usable, max_num_seqs=settings.max_num_seqs),
        connector=settings.connector if pd else None,
        # push: the decode worker polls the prefill worker's bootstrap rooms on its HTTP port
        bootstrap_addr=f"{host}:{settings.port}" if pd and settings.connector == "push" else None,
    )
    record = with_nats_subjects(record, settings)
    return MockService(settings, renderer, engine, make_role(settings, pool, record, host), record)


def main(argv: Sequence[str] | None = None) -> None:
    settings = load(MockEngineSettings, argv, prog="python -m infera.engine.mock", description=DESCRIPTION)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    check_available(settings)
    service = build(settings)
    service.engine.profiler = StepProfiler(settings.profile_dir, service.record.instance_id)
    kvd = KvdServer.from_settings(settings, service.engine, service.record.instance_id)
    config = uvicorn.Config(build_app(service, kvd), host=settings.host, port=settings.port, loop="uvloop",
                            http="httptools", log_level=settings.log_level, access_log=False,
                            timeout_keep_alive=30, timeout_graceful_shutdown=math.ceil(settings.drain_seconds))
    # --discovery-backend etcd: publish the record once listening; SIGTERM deregisters, then drains.
    registrar = make_registrar(settings)
    server = uvicorn.Server(config) if registrar is None else RegisteredServer(config, registrar, service.record)
    bridge = bridge_for(service.record, settings)  # --request-transport / --kv-event-transport nats
    if bridge is None:
        server.run()
    else:
        serve_with_bridge(server, bridge)
    sys.exit(0)


if __name__ == "__main__":
    main()
