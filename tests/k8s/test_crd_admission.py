"""The emulator admits custom resources like the API server: prune, default, validate, CEL rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.kube.emulator import ApiError, Emulator
from infera.discovery.kubernetes_client import api_client
from infera.operator.kube import Kube
from infera.operator.reconcile import reconcile
from tests.operator.manifests import crd

NS = "infer"


def fleet(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "infera.ai/v1alpha1", "kind": "InferaFleet", "metadata": {"name": "demo", "namespace": NS},
            "spec": {"model": "m", "engine": "mock", "modelPath": "/tok", **spec}}


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        e.create(crd())
        yield e


def refused(emu: Emulator, obj: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as info:
        emu.create(obj)
    assert info.value.code == 422
    return info.value.message


def test_defaults_are_filled_in_and_unknown_fields_pruned(emu: Emulator) -> None:
    stored = emu.create(fleet(surprise=True))
    spec = stored["spec"]
    assert "surprise" not in spec, "unknown fields are pruned"
    assert spec["router"]["policy"] == "kv-aware" and spec["transport"]["request"] == "http"
    assert spec["pools"]["mixed"]["replicas"] == 1


def test_schema_violations_name_the_field(emu: Emulator) -> None:
    message = refused(emu, fleet(pools={"mixed": {"replicas": -1}}))
    assert "spec.pools.mixed.replicas" in message and "-1" in message


def test_cel_rules_are_evaluated(emu: Emulator) -> None:
    assert "prefill and decode pools go together" in refused(emu, fleet(pools={"prefill": {"replicas": 1}}))
    assert "natsUrl is required" in refused(emu, fleet(transport={"request": "nats"}))
    emu.create(fleet(transport={"request": "nats", "natsUrl": "nats://n:4222"}))


async def test_the_operator_writes_status_the_schema_accepts(emu: Emulator, tmp_path: Path) -> None:
    emu.create(fleet())
    client = await api_client(str(emu.kubeconfig(tmp_path / "kubeconfig")))
    try:
        out = await reconcile(Kube(client), NS, "demo")
    finally:
        await client.close()
    assert not out.problems
    stored = emu.get("infera.ai/v1alpha1", "InferaFleet", "demo", NS)
    assert stored is not None and stored["status"]["conditions"], "the status write was admitted"


def test_names_that_make_invalid_service_names_are_refused(emu: Emulator) -> None:
    too_long = fleet()
    too_long["metadata"]["name"] = "f" * 55
    assert "at most 54 characters" in refused(emu, too_long)
    digit = fleet()
    digit["metadata"]["name"] = "7up"
    assert "must start with a letter" in refused(emu, digit)


def test_quantities_may_be_numbers_or_strings(emu: Emulator) -> None:
    stored = emu.create(fleet(pools={"mixed": {"resources": {"limits": {"cpu": 2, "memory": "4Gi"}}}}))
    assert stored["spec"]["pools"]["mixed"]["resources"]["limits"] == {"cpu": 2, "memory": "4Gi"}
    assert "Invalid value" in refused(emu, {**fleet(pools={"mixed": {"resources": {"limits": {"cpu": [1]}}}}),
                                            "metadata": {"name": "other", "namespace": NS}})
