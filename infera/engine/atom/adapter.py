"""How to launch and read ATOM (AMD's vLLM-like engine, ``atom.entrypoints.openai_server``). Best effort.

ATOM's documented server flags are ``--model``, ``--host``, ``--server-port`` and
``--block-size`` (its ``kv_cache_block_size``); its documentation names no KV-event
publisher, so none is switched on and the record advertises none unless the engine is
given one through extra engine args and ``--kv-events-port``. In-flight requests are read
from vLLM-named gauges if ATOM serves them.
"""

from __future__ import annotations

import json
import shlex
import sys

from infera.config.worker import WorkerSettings
from infera.engine.base import EngineInfo, EnginePorts, Fetch, sum_gauges

MODULE = "atom.entrypoints.openai_server"


class AtomAdapter:
    name = "atom"
    publishes_kv_events = False
    connector = "pull"  # vLLM-style kv_transfer_params; its PD engine flags go in the engine args

    def command(self, settings: WorkerSettings, ports: EnginePorts) -> list[str]:
        base = shlex.split(settings.engine_command) or [sys.executable, "-m", MODULE]
        argv = [*base, "--model", settings.model_path, "--host", settings.host, "--server-port", str(ports.http)]
        if settings.block_size:
            argv += ["--block-size", str(settings.block_size)]
        if settings.max_num_seqs:
            argv += ["--max-num-seqs", str(settings.max_num_seqs)]
        return argv

    async def info(self, fetch: Fetch) -> EngineInfo:
        body = await fetch("/v1/models")
        data = (json.loads(body).get("data") or []) if body else []
        return EngineInfo(model=str(data[0].get("id", "")) if data else "")

    def in_flight(self, metrics: str) -> int | None:
        return sum_gauges(metrics, ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                    "atom:num_requests_running", "atom:num_requests_waiting"))
