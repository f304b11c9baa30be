"""The install paths: the Helm chart, the kustomize base and its rendered install.yaml, kind config."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
import pytest
import yaml

from infera.config.base import env_names
from infera.config.operator import OperatorSettings
from infera.config.server import ServerSettings
from tests.operator.helm_lite import render
from tests.operator.manifests import REPO, load_all, validate

CHART = REPO / "charts" / "infera"
SCHEMA_ENV = {n for cls in (ServerSettings, OperatorSettings) for f in dataclasses.fields(cls) for n in env_names(f)}


def chart_docs(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs = []
    for path in sorted((CHART / "templates").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(render(path.read_text(encoding="utf-8"), values, chart=CHART)) if d]
    return docs


def chart_values(**frontend: Any) -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    values["frontend"].update(frontend)
    return dict(values)


@pytest.mark.parametrize("frontend", [False, True])
def test_chart_renders_valid_manifests(frontend: bool) -> None:
    values = chart_values(enabled=frontend)
    jsonschema.validate(values, json.loads((CHART / "values.schema.json").read_text(encoding="utf-8")))
    docs = chart_docs(values)
    kinds = sorted(d["kind"] for d in docs)
    assert ("Service" in kinds) == frontend
    for doc in docs:
        validate(doc)
    for doc in [*docs, *load_all(CHART / "crds" / "inferafleets.infera.ai.yaml")]:
        validate(doc)


def test_chart_env_names_come_from_the_settings_schemas() -> None:
    for doc in chart_docs(chart_values(enabled=True)):
        if doc["kind"] != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            names = {e["name"] for e in c.get("env", [])} - {"POD_NAMESPACE"}
            assert names <= SCHEMA_ENV, names - SCHEMA_ENV


def test_values_schema_refuses_bad_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(chart_values(replicas=-1), schema)


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """What kustomize may change in this base (namespace, image tag) taken out."""
    doc = json.loads(json.dumps(doc))
    doc.get("metadata", {}).pop("namespace", None)
    for subject in doc.get("subjects", []):
        subject.pop("namespace", None)
    for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        container["image"] = container["image"].split(":")[0]
    return doc


def test_install_yaml_is_the_rendered_kustomize_base_and_valid() -> None:
    docs = load_all(REPO / "deploy" / "install.yaml")
    assert {d["kind"] for d in docs} >= {"CustomResourceDefinition", "Deployment", "ClusterRole"}
    for doc in docs:
        validate(doc)
    # Every object of the kustomize base is in install.yaml unchanged but for namespace and image tag
    # (kubectl kustomize deploy/ > deploy/install.yaml re-renders it), and nothing else is.
    base = yaml.safe_load((REPO / "deploy" / "kustomization.yaml").read_text(encoding="utf-8"))
    sources: list[dict[str, Any]] = []
    for entry in base["resources"]:
        path = (REPO / "deploy" / entry).resolve()
        files = sorted(p for p in path.glob("*.yaml") if p.name != "kustomization.yaml") if path.is_dir() else [path]
        for file in files:
            sources.extend(load_all(file))
    rendered = {(d["kind"], d["metadata"]["name"]): _comparable(d) for d in docs}
    expected = {(d["kind"], d["metadata"]["name"]): _comparable(d) for d in sources}
    assert rendered.keys() == expected.keys(), "deploy/install.yaml is stale: kubectl kustomize deploy/"
    for key, doc in expected.items():
        assert rendered[key] == doc, f"{key} differs: deploy/install.yaml is stale"
    operator = next(d for d in docs if d["kind"] == "Deployment")
    assert operator["metadata"]["namespace"] == base["namespace"]
    assert all(c["image"].endswith(":" + base["images"][0]["newTag"])
               for c in operator["spec"]["template"]["spec"]["containers"] if c["image"].startswith("infera"))


def test_operator_rbac_is_the_same_in_chart_and_kustomize() -> None:
    chart = next(d for d in chart_docs(chart_values()) if d["kind"] == "ClusterRole")
    base = next(d for d in load_all(REPO / "deploy" / "operator.yaml") if d["kind"] == "ClusterRole")
    assert chart["rules"] == base["rules"]


def test_kind_config_parses() -> None:
    cfg = yaml.safe_load((REPO / "kind-config.yaml").read_text(encoding="utf-8"))
    assert cfg["kind"] == "Cluster" and cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"


def test_the_image_story_holds_together() -> None:
    """kind-up builds and loads one image; the CRD's default, the operator's and the samples name it."""
    script = (REPO / "scripts" / "kind-up").read_text(encoding="utf-8")
    built = next(line.split("=", 1)[1] for line in script.splitlines() if line.startswith("IMAGE="))
    crd = yaml.safe_load((REPO / "crds" / "inferafleets.infera.ai.yaml").read_text(encoding="utf-8"))
    spec_props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec_props["image"]["default"] == built
    from infera.operator.spec import FleetSpec

    assert FleetSpec.parse({"model": "m"}).image == built
    for sample in (REPO / "deploy" / "samples").glob("*.yaml"):
        for doc in load_all(sample):
            assert doc["spec"].get("image", built) == built, f"{sample.name} names an image nothing builds"
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    assert {".venv", ".cache", ".git"} <= set(ignored), "the build context would upload the venv and caches"


def test_kind_up_port_forward_does_not_collide_with_a_host_port_mapping() -> None:
    cfg = yaml.safe_load((REPO / "kind-config.yaml").read_text(encoding="utf-8"))
    mapped = {m["hostPort"] for node in cfg["nodes"] for m in node.get("extraPortMappings") or []}
    script = (REPO / "scripts" / "kind-up").read_text(encoding="utf-8")
    forwarded = {int(p.split(":")[0]) for p in script.split() if p.count(":") == 1 and p.split(":")[0].isdigit()}
    assert forwarded, "kind-up port-forwards the frontend"
    assert not mapped & forwarded, f"host port(s) {mapped & forwarded} are both mapped by kind and port-forwarded"
