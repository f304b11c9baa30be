"""The CRD and the operator's model of its spec agree: same fields, same defaults, valid manifest."""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from pydantic import BaseModel, ValidationError

from infera.operator.spec import API_VERSION, KIND, PLURAL, FleetSpec
from tests.operator.manifests import K8S_VERSION, REPO, apply_defaults, crd, crd_schema, validate


def test_crd_is_a_valid_manifest_with_status_subresource_and_columns() -> None:
    doc = crd()
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    version = doc["spec"]["versions"][0]
    assert f"{doc['spec']['group']}/{version['name']}" == API_VERSION
    assert doc["spec"]["names"]["kind"] == KIND and doc["spec"]["names"]["plural"] == PLURAL
    assert version["subresources"] == {"status": {}}
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Model", "Ready", "Workers"}


def test_chart_crds_are_identical_to_crds_dir() -> None:
    for path in (REPO / "crds").glob("*.infera.ai.yaml"):
        assert (REPO / "charts" / "infera" / "crds" / path.name).read_bytes() == path.read_bytes()


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    return {(f.alias or n): f for n, f in model.model_fields.items()}


def _walk(schema: dict[str, Any], model: type[BaseModel], where: str) -> None:
    props = schema.get("properties") or {}
    fields = _fields(model)
    assert set(props) == set(fields), f"{where}: CRD {sorted(props)} != model {sorted(fields)}"
    for name, f in fields.items():
        sub = props[name]
        ann = f.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if inner and sub.get("type") == "object":
            _walk(sub, inner[0], f"{where}.{name}")


def test_crd_properties_match_the_model() -> None:
    _walk(crd_schema()["properties"]["spec"], FleetSpec, "spec")


@pytest.mark.parametrize("spec", [
    {"model": "m"},
    {"model": "m", "pools": {"prefill": {}, "decode": {"replicas": 3}}},
    {"model": "m", "gaie": {"enabled": True}, "router": {"policy": "round-robin"}},
])
def test_crd_defaults_equal_model_defaults(spec: dict[str, Any]) -> None:
    defaulted = apply_defaults(crd_schema()["properties"]["spec"], spec)
    assert FleetSpec.parse(defaulted) == FleetSpec.parse(spec)


@pytest.mark.parametrize("bad", [
    {},  # no model
    {"model": "m", "engine": "tgi"},
    {"model": "m", "pools": {"mixed": {"replicas": -1}}},
    {"model": "m", "router": {"mode": "manual"}},
    {"model": "m", "unknown": 1},
])
def test_crd_and_model_both_refuse_bad_specs(bad: dict[str, Any]) -> None:
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": bad}
    crd_refuses = False
    try:
        validate(doc)
    except jsonschema.ValidationError:
        crd_refuses = True
    # the API server prunes unknown fields rather than refusing them; the model refuses both ways
    assert crd_refuses or "unknown" in bad
    with pytest.raises(ValidationError):
        FleetSpec.parse(bad)
