from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from infera.config import load
from infera.config.base import build_parser
from infera.config.engine import MockEngineSettings
from infera.config.server import ServerSettings
from infera.config.worker import WorkerSettings

STATIC = ["--discovery-backend", "static", "--worker-url", "http://127.0.0.1:1"]


def test_flag_beats_env_beats_default() -> None:
    env = {"INFERA_ROUTER_POLICY": "round-robin", "INFERA_PORT": "9001", "INFERA_REQUEST_MAX_RETRIES": "3"}
    s = load(ServerSettings, [*STATIC, "--port", "9002"], env)
    assert s.port == 9002  # flag wins
    assert s.router_policy == "round-robin"  # env wins over default
    assert s.request_max_retries == 3
    assert s.kv_overlap_weight == 1.0  # default


def test_production_defaults_follow_the_spec() -> None:
    s = load(ServerSettings, ["--router-tokenizer-path", "/tok"], {})
    assert (s.discovery_backend, s.request_transport, s.kv_event_transport) == ("kubernetes", "nats", "nats")
    assert (s.router_mode, s.router_policy, s.port, s.request_max_retries) == ("auto", "kv-aware", 8000, 1)


def test_repeatable_flag_and_env_list() -> None:
    s = load(ServerSettings, ["--router-policy", "round-robin", "--discovery-backend", "static",
                              "--worker-url", "http://a", "--worker-url", "http://b"], {})
    assert s.worker_url == ("http://a", "http://b")
    s = load(ServerSettings, ["--router-policy", "round-robin", "--discovery-backend", "static"],
             {"INFERA_WORKER_URL": "http://a,http://b"})
    assert s.worker_url == ("http://a", "http://b")


def test_nats_env_names_without_prefix() -> None:
    s = load(ServerSettings, [*STATIC, "--router-policy", "round-robin"], {"NATS_URL": "nats://x:4222"})
    assert s.nats_server == "nats://x:4222"


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (STATIC, {}, "--router-tokenizer-path is required"),
        (["--router-policy", "round-robin", "--discovery-backend", "static"], {}, "needs --worker-url"),
        ([*STATIC, "--router-policy", "fastest"], {}, "invalid choice"),
        ([*STATIC, "--router-policy", "round-robin"], {"INFERA_ROUTER_MODE": "sideways"}, "not one of"),
        ([*STATIC, "--router-policy", "round-robin", "--port", "eighty"], {}, "--port"),
    ],
)
def test_bad_settings_exit_with_a_clear_message(argv: list[str], env: dict[str, str], needle: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load(ServerSettings, argv, env)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.e2e  # runs the CLIs
def test_help_shows_defaults_and_env_names() -> None:
    out = subprocess.run([sys.executable, "-m", "infera.server", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "--kv-overlap-weight" in out and "default: 1.0" in out and "INFERA_KV_OVERLAP_WEIGHT" in out
    assert "INFERA_ROUTER_MODE" in out and "INFERA_REQUEST_MAX_RETRIES" in out
    out = subprocess.run([sys.executable, "-m", "infera.engine.mock", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "--speedup-ratio" in out and "INFERA_SPEEDUP_RATIO" in out


@pytest.mark.e2e  # runs the server
def test_nats_without_a_broker_address_fails_fast_naming_the_alternative() -> None:
    proc = subprocess.run([sys.executable, "-m", "infera.server", "--router-policy", "round-robin", *STATIC],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "NATS_SERVER": "",
                                                                          "NATS_URL": ""})
    assert proc.returncode == 2
    assert "--request-transport nats needs" in proc.stderr and "--nats-server" in proc.stderr
    assert "--request-transport http" in proc.stderr


def test_nats_request_controls_flag_env_default() -> None:
    s = load(ServerSettings, [*STATIC, "--router-policy", "round-robin", "--nats-req-max-pending", "4"],
             {"INFERA_NATS_REQ_IDLE_TIMEOUT": "30", "NATS_SERVER": "nats://a:4222"})
    assert (s.nats_req_idle_timeout, s.nats_req_max_duration, s.nats_req_max_pending) == (30.0, 0.0, 4)
    assert s.nats_server == "nats://a:4222"
    assert load(ServerSettings, [*STATIC, "--router-policy", "round-robin"], {}).nats_req_idle_timeout == 900.0


def test_mock_settings_defaults() -> None:
    s = load(MockEngineSettings, [], {})
    assert s.block_size > 0 and s.num_kv_blocks > 0 and s.role == "mixed"


@pytest.mark.parametrize("worker_cls", [MockEngineSettings, WorkerSettings])
def test_worker_and_server_defaults_meet(worker_cls: type[Any]) -> None:
    """A worker and a server started with no plane flags agree on the reference's plane."""
    server = load(ServerSettings, ["--router-tokenizer-path", "/tok"], {})
    worker = load(worker_cls, ["--model-path", "/m"], {})
    plane = ("discovery_backend", "request_transport", "kv_event_transport")
    assert [getattr(worker, f) for f in plane] == [getattr(server, f) for f in plane] == ["kubernetes", "nats", "nats"]


def test_static_discovery_says_what_it_is_for() -> None:
    for cls in (ServerSettings, MockEngineSettings, WorkerSettings):
        text = build_parser(cls, "prog", "").format_help()
        assert "static is for one box" in " ".join(text.split()) or "static publishes nothing, for one box" in " ".join(
            text.split()), cls.__name__
