"""The picker's settings: the frontend's routing flags and env names, its own ports."""

from __future__ import annotations

import pytest

from infera.config import load
from infera.config.picker import PickerSettings

STATIC = ["--discovery-backend", "static", "--worker-url", "http://127.0.0.1:1", "--router-policy", "round-robin"]


def test_defaults_are_the_stock_pickers_ports() -> None:
    s = load(PickerSettings, STATIC, {})
    assert (s.port, s.metrics_port, s.fallback_endpoints) == (9002, 9090, 0)
    assert s.destination_header == "x-gateway-destination-endpoint" and s.metadata_namespace == "envoy.lb"


def test_it_reads_the_frontends_env_names_flag_beating_env() -> None:
    env = {"INFERA_KV_OVERLAP_WEIGHT": "2.5", "INFERA_REQUEST_TRANSPORT": "http", "INFERA_TARGET_PORT": "8000"}
    s = load(PickerSettings, [*STATIC, "--target-port", "8001"], env)
    assert (s.kv_overlap_weight, s.request_transport, s.target_port) == (2.5, "http", 8001)


def test_it_refuses_direct_mode_it_is_the_one_that_picks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load(PickerSettings, [*STATIC, "--router-mode", "direct"], {})
    assert "--router-mode must be auto" in capsys.readouterr().err
