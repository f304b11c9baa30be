"""How to launch and read SGLang (``sglang.launch_server``).

KV events: ``--kv-events-config`` (the same JSON as vLLM's: a ZMQ publisher bound on
``tcp://*:<port>``, a replay socket, a topic); ``--enable-metrics`` so the drain can count
in-flight requests (``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``). Block size
(``page_size``) and capacity (``max_total_num_tokens`` / page size) come from
``GET /get_server_info``.

Disaggregation (``--role prefill|decode``): ``--disaggregation-mode prefill|decode``, and on
a prefill worker ``--disaggregation-bootstrap-port``, the port its decode peers' bootstrap
handshake reaches (advertised as the record's ``bootstrap_addr``; the router hands it to
both legs with a fresh room). The KV transfer backend stays SGLang's default (mooncake);
another (``--disaggregation-transfer-backend nixl``) goes in the engine args.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

from infera.config.worker import WorkerSettings
from infera.engine.base import EngineInfo, EnginePorts, Fetch, kv_events_config, sum_gauges

MODULE = "sglang.launch_server"


class SglangAdapter:
    name = "sglang"
    publishes_kv_events = True
    connector = "push"

    def command(self, settings: WorkerSettings, ports: EnginePorts) -> list[str]:
        base = shlex.split(settings.engine_command) or [sys.executable, "-m", MODULE]
        argv = [*base, "--model-path", settings.model_path, "--host", settings.host, "--port", str(ports.http),
                "--enable-metrics"]
        if settings.served_model_name:
            argv += ["--served-model-name", settings.served_model_name]
        if settings.block_size:
            argv += ["--page-size", str(settings.block_size)]
        if settings.max_num_seqs:
            argv += ["--max-running-requests", str(settings.max_num_seqs)]
        if ports.kv_events:
            config = kv_events_config(ports, settings.kv_events_topic, with_flag=False)
            argv += ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
        if settings.role != "mixed":
            argv += ["--disaggregation-mode", settings.role]
        if settings.role == "prefill":
            argv += ["--disaggregation-bootstrap-port", str(settings.disaggregation_bootstrap_port)]
        return argv

    async def info(self, fetch: Fetch) -> EngineInfo:
        body = await fetch("/get_server_info")
        if not body:
            return EngineInfo()
        doc: dict[str, Any] = json.loads(body)
        page = int(doc.get("page_size") or 0)
        tokens = int(doc.get("max_total_num_tokens") or 0)
        model = str(doc.get("served_model_name") or doc.get("model_path") or "")
        return EngineInfo(model=model, block_size=page, kv_blocks=tokens // page if page else 0,
                          max_num_seqs=int(doc.get("max_running_requests") or 0))

    def in_flight(self, metrics: str) -> int | None:
        return sum_gauges(metrics, ("sglang:num_running_reqs", "sglang:num_queue_reqs"))
