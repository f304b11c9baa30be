"""The worker wrappers (``python -m infera.engine.vllm|sglang|atom``): the argv each adapter builds,
and the wrapper as a real process around a fake engine (the mock engine behind a vLLM/SGLang command
line) registered in a real etcd: launch, health wait, register, signal forwarding, exit code."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import REPO, EtcdServer, Process, free_port, http_ok, spawn
from infera.config import load
from infera.config.server import ServerSettings
from infera.config.worker import WorkerSettings
from infera.discovery.etcd import EtcdFleet
from infera.engine.atom.adapter import AtomAdapter
from infera.engine.base import EngineInfo, EnginePorts
from infera.engine.sglang.adapter import SglangAdapter
from infera.engine.vllm.adapter import VllmAdapter
from infera.engine.wrapper import build_record, exit_code
from tests.discovery.conftest import etcd  # noqa: F401 (fixture)
from tests.discovery.test_etcd import eventually

FAKE = f"{sys.executable} {REPO / 'tests' / 'engine' / 'fake_engine.py'}"


def settings(*argv: str) -> WorkerSettings:
    return load(WorkerSettings, ["--model-path", "/models/m", *argv], environ={})


def test_vllm_argv_binds_its_kv_event_publisher() -> None:
    s = settings("--port", "8100", "--block-size", "32", "--served-model-name", "m1", "--max-num-seqs", "8")
    argv = VllmAdapter().command(s, EnginePorts(http=8100, kv_events=5601, kv_replay=5602))
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/models/m"
    assert argv[argv.index("--port") + 1] == "8100"
    assert argv[argv.index("--block-size") + 1] == "32"
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    assert "--enable-prefix-caching" in argv
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert config == {"publisher": "zmq", "endpoint": "tcp://*:5601", "replay_endpoint": "tcp://*:5602",
                      "topic": "kv-events", "enable_kv_cache_events": True}


def test_sglang_argv() -> None:
    s = settings("--block-size", "16", "--engine-command", "my-python -m sglang.launch_server")
    argv = SglangAdapter().command(s, EnginePorts(http=30000, kv_events=5601))
    assert argv[:3] == ["my-python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == "/models/m"
    assert argv[argv.index("--page-size") + 1] == "16"
    assert "--enable-metrics" in argv
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert config == {"publisher": "zmq", "endpoint": "tcp://*:5601", "topic": "kv-events"}


def test_atom_argv() -> None:
    argv = AtomAdapter().command(settings("--block-size", "16"), EnginePorts(http=8006))
    assert argv[argv.index("--server-port") + 1] == "8006" and argv[argv.index("--model") + 1] == "/models/m"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_sglang_starts_in_its_disaggregation_role_and_advertises_the_bootstrap(role: str) -> None:
    s = settings("--role", role, "--disaggregation-bootstrap-port", "9001", "--advertise-host", "10.0.0.7")
    adapter = SglangAdapter()
    argv = adapter.command(s, EnginePorts(http=30000))
    assert argv[argv.index("--disaggregation-mode") + 1] == role
    assert ("--disaggregation-bootstrap-port" in argv) == (role == "prefill")
    if role == "prefill":
        assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == "9001"
    record = build_record(adapter, s, "http://10.0.0.7:30000", EnginePorts(http=30000), EngineInfo())
    assert record.role == role and record.connector == "push"
    assert record.bootstrap_addr == ("10.0.0.7:9001" if role == "prefill" else None)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_vllm_starts_with_the_nixl_connector_and_advertises_pull(role: str) -> None:
    s = settings("--role", role)
    adapter = VllmAdapter()
    argv = adapter.command(s, EnginePorts(http=8100))
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == {"kv_connector": "NixlConnector",
                                                                        "kv_role": "kv_both"}
    record = build_record(adapter, s, "http://127.0.0.1:8100", EnginePorts(http=8100), EngineInfo())
    assert (record.role, record.connector, record.bootstrap_addr) == (role, "pull", None)


@pytest.mark.parametrize("adapter", [SglangAdapter(), VllmAdapter()], ids=["sglang", "vllm"])
def test_a_mixed_worker_starts_no_disaggregation(adapter: SglangAdapter | VllmAdapter) -> None:
    argv = adapter.command(settings(), EnginePorts(http=8100))
    assert not {"--disaggregation-mode", "--disaggregation-bootstrap-port", "--kv-transfer-config"} & set(argv)
    record = build_record(adapter, settings(), "http://127.0.0.1:8100", EnginePorts(http=8100), EngineInfo())
    assert (record.role, record.connector, record.bootstrap_addr) == ("mixed", None, None)


async def test_vllm_info_from_its_metrics() -> None:
    metrics = ('# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",num_gpu_blocks="9362",'
               'enable_prefix_caching="True"} 1.0\nvllm:num_requests_running{model_name="m"} 2.0\n'
               'vllm:num_requests_waiting{model_name="m"} 1.0\n')
    bodies = {"/metrics": metrics, "/v1/models": '{"data": [{"id": "smol"}]}'}

    async def fetch(path: str) -> str | None:
        return bodies.get(path)

    adapter = VllmAdapter()
    info = await adapter.info(fetch)
    assert info == EngineInfo(model="smol", block_size=16, kv_blocks=9362)
    assert adapter.in_flight(metrics) == 3
    assert adapter.in_flight("") is None
    record = build_record(adapter, settings("--advertise-host", "10.0.0.5"), "http://10.0.0.5:8000",
                          EnginePorts(http=8000, kv_events=5601, kv_replay=5602), info)
    assert record.instance_id == "vllm-10.0.0.5-8000" and record.model == "smol"
    assert record.kv_block_size == 16 and record.capacity.kv_blocks == 9362
    assert record.kv_events is not None and record.kv_events.endpoint == "tcp://10.0.0.5:5601"
    assert record.kv_events.replay_endpoint == "tcp://10.0.0.5:5602"


def test_worker_flags_match_the_servers() -> None:
    """One config path: the discovery/transport flags have the server's names, env vars and choices."""
    import dataclasses

    from infera.config.base import env_names

    server = {f.name: f for f in dataclasses.fields(ServerSettings)}
    for f in dataclasses.fields(WorkerSettings):
        if f.name in ("discovery_backend", "etcd_endpoint", "request_transport", "kv_event_transport", "nats_server"):
            assert env_names(f) == env_names(server[f.name])
            assert f.metadata["infera"].choices == server[f.name].metadata["infera"].choices
    assert exit_code(-15) == 143 and exit_code(3) == 3


# -- the wrapper as a process ---------------------------------------------------------------


@pytest.fixture
def procs() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for p in started:
        p.stop()


def start_wrapper(tmp: Path, engine: str, etcd_endpoint: str, *args: str, env: dict[str, str] | None = None) -> Process:
    """The wrapper around the fake engine; ``env`` reaches the engine (via ``env(1)`` in its command)."""
    port = free_port()
    prefix = "env " + " ".join(f"{k}={v}" for k, v in (env or {}).items()) + " " if env else ""
    argv = [sys.executable, "-m", f"infera.engine.{engine}", "--model-path", "fake-model", "--port", str(port),
            "--engine-command", f"{prefix}{FAKE} {engine}", "--discovery-backend", "etcd",
            "--etcd-endpoint", etcd_endpoint, "--lease-ttl", "3",
            "--request-transport", "http", "--kv-event-transport", "zmq", *args]
    return spawn(argv, f"http://127.0.0.1:{port}", tmp / f"{engine}-{port}.log")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
async def test_wrapper_launches_registers_and_forwards_sigterm(engine: str, etcd: EtcdServer,  # noqa: F811
                                                               tmp_path: Path, procs: list[Process]) -> None:
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    try:
        argv_file = tmp_path / "argv.json"
        t0 = time.monotonic()
        wrapper = start_wrapper(tmp_path, engine, etcd.endpoint, "--instance-id", "w", "--block-size", "32",
                                "--drain-seconds", "5", env={"FAKE_ENGINE_ARGV": str(argv_file)})
        procs.append(wrapper)
        await eventually(lambda: "w" in fleet.workers(), limit=30.0, what="wrapped engine registered")
        print(f"\n{engine}: wrapper start -> routable {time.monotonic() - t0:.2f}s")
        record = fleet.workers()["w"]
        assert record.engine == engine and record.http_url == wrapper.url and record.model == "fake-model"
        assert record.kv_block_size == 32 and record.capacity.kv_blocks == 1023  # flag; the engine's usable blocks
        assert http_ok(wrapper.url + "/health")  # the engine serves where the record says
        engine_argv = json.loads(argv_file.read_text())
        config = json.loads(engine_argv[engine_argv.index("--kv-events-config") + 1])
        port = config["endpoint"].rsplit(":", 1)[1]
        assert config["endpoint"] == f"tcp://*:{port}"
        assert record.kv_events is not None and record.kv_events.endpoint == f"tcp://127.0.0.1:{port}"
        assert record.kv_events.replay_endpoint == "tcp://127.0.0.1:" + config["replay_endpoint"].rsplit(":", 1)[1]

        wrapper.popen.send_signal(signal.SIGTERM)
        await eventually(lambda: "w" not in fleet.workers(), limit=2.0, what="deregistered on SIGTERM")
        code = await asyncio.to_thread(wrapper.popen.wait, 20)
        assert code == 143, wrapper.output()  # the engine died of the forwarded SIGTERM; its code passed on
        if engine == "vllm":  # the mock serves vLLM's gauges, not SGLang's: that drain runs its full time
            assert "drained: nothing in flight" in wrapper.output()
    finally:
        await fleet.stop()


async def test_wrapper_deregisters_and_exits_with_the_engines_code(etcd: EtcdServer,  # noqa: F811
                                                                   tmp_path: Path, procs: list[Process]) -> None:
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    try:
        wrapper = start_wrapper(tmp_path, "vllm", etcd.endpoint, "--instance-id", "dies",
                                env={"FAKE_ENGINE_EXIT_AFTER": "6:3"})
        procs.append(wrapper)
        await eventually(lambda: "dies" in fleet.workers(), limit=30.0, what="registered")
        code = await asyncio.to_thread(wrapper.popen.wait, 20)
        assert code == 3
        assert "dies" not in fleet.workers()  # deregistered at once, not after the TTL
    finally:
        await fleet.stop()


async def test_wrapper_attaches_to_a_running_engine(etcd: EtcdServer, tmp_path: Path,  # noqa: F811
                                                    procs: list[Process]) -> None:
    from harness import start_mock

    engine = start_mock(tmp_path)
    procs.append(engine)
    fleet = EtcdFleet(etcd.endpoint)
    await fleet.start()
    try:
        argv = [sys.executable, "-m", "infera.engine.vllm", "--engine-url", engine.url, "--instance-id", "att",
                "--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint,
                "--request-transport", "http", "--kv-event-transport", "zmq"]
        wrapper = spawn(argv, engine.url, tmp_path / "attach.log")
        procs.append(wrapper)
        await eventually(lambda: "att" in fleet.workers(), limit=20.0, what="attached engine registered")
        record = fleet.workers()["att"]
        assert record.http_url == engine.url and record.model == "mock-model"
        assert record.kv_events is not None  # taken from the engine's own GET /infera/worker
        wrapper.popen.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(wrapper.popen.wait, 20) == 0
        assert "att" not in fleet.workers() and engine.alive()  # attached: the engine is not ours to stop
    finally:
        await fleet.stop()


async def test_wrapper_on_nats_bridges_requests_and_relays_kv_events(etcd: EtcdServer,  # noqa: F811
                                                                     tmp_path: Path, procs: list[Process]) -> None:
    """The production plane's shape: a wrapped engine registered in etcd, requests and KV events over NATS."""
    from harness import NatsServer, metric, scrape, start_frontend

    broker = NatsServer(tmp_path / "nats.log")
    broker.start()
    try:
        nats = ("--request-transport", "nats", "--kv-event-transport", "nats", "--nats-server", broker.url)
        wrapper = start_wrapper(tmp_path, "vllm", etcd.endpoint, "--instance-id", "w", *nats)
        procs.append(wrapper)
        frontend = start_frontend(tmp_path, [], policy="round-robin", expect_workers=1,
                                  args=("--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint, *nats))
        procs.append(frontend)
        import httpx

        async with httpx.AsyncClient(timeout=30) as http:
            reply = await http.post(frontend.url + "/v1/completions",
                                    json={"model": "fake-model", "prompt": "hello over nats", "max_tokens": 4})
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-infera-worker"] == "w" and reply.json()["usage"]["completion_tokens"] == 4
            record = (await http.get(frontend.url + "/v1/workers")).json()["data"][0]
        assert record["nats_subject"] and record["nats_kv_subject"]
        kv_frontend = start_frontend(tmp_path, [], policy="kv-aware", tokenizer=REPO / ".cache" / "qwen-tokenizer",
                                     expect_workers=1, args=("--discovery-backend", "etcd", "--etcd-endpoint",
                                                             etcd.endpoint, *nats))
        procs.append(kv_frontend)
        # The engine's earlier BlockStored reached this frontend through the wrapper's relay (replayed from seq 0).
        await eventually(lambda: metric(scrape(kv_frontend.url), "infera_kv_event_batches_total", worker="w") > 0,
                         limit=20.0, what="KV events relayed over NATS")
    finally:
        broker.stop()
