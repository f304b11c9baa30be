"""What Go clients (Helm, kubectl) need from the emulator besides JSON CRUD: OpenAPI documents, a CRD
that reports Established, streaming lists that end with the initial-events bookmark, and protobuf
bodies for Secrets."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from harness.kube.emulator import Emulator
from tests.operator.manifests import crd


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        e.create(crd())
        yield e


def get(emu: Emulator, path: str) -> Any:
    with urllib.request.urlopen(emu.url + path, timeout=10) as resp:
        return json.load(resp)


def test_openapi_v3_lists_every_group_version_with_builtin_and_crd_schemas(emu: Emulator) -> None:
    index = get(emu, "/openapi/v3")["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/infera.ai/v1alpha1"} <= set(index)
    core = get(emu, index["api/v1"]["serverRelativeURL"])["components"]["schemas"]
    namespace = core["io.k8s.api.core.v1.Namespace"]
    assert namespace["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Namespace", "version": "v1"}]
    assert namespace["properties"]["metadata"]["$ref"].startswith("#/components/schemas/")
    custom = get(emu, index["apis/infera.ai/v1alpha1"]["serverRelativeURL"])["components"]["schemas"]
    fleet = next(s for s in custom.values()
                 if {"group": "infera.ai", "version": "v1alpha1", "kind": "InferaFleet"}
                 in s.get("x-kubernetes-group-version-kind", []))
    assert "spec" in fleet["properties"]
    with pytest.raises(urllib.error.HTTPError):
        get(emu, "/openapi/v3/apis/nothing.example/v1")


def test_a_stored_crd_is_established(emu: Emulator) -> None:
    stored = emu.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "inferafleets.infera.ai") or {}
    assert {(c["type"], c["status"]) for c in stored["status"]["conditions"]} >= {("Established", "True")}


def test_a_streaming_list_ends_its_initial_events_with_a_bookmark(emu: Emulator) -> None:
    emu.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "default"}})
    url = (emu.url + "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true"
           "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2")
    with urllib.request.urlopen(url, timeout=10) as resp:
        first, second = json.loads(resp.readline()), json.loads(resp.readline())
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "a")
    assert second["type"] == "BOOKMARK"
    assert second["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def _field(number: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_a_protobuf_secret_is_stored_as_json(emu: Emulator) -> None:
    meta = _field(1, b"release") + _field(11, _field(1, b"owner") + _field(2, b"helm"))
    secret = _field(1, meta) + _field(2, _field(1, b"release") + _field(2, b"\x00\xffdata")) + _field(3, b"helm.sh/x")
    body = b"k8s\x00" + _field(1, _field(1, b"v1") + _field(2, b"Secret")) + _field(2, secret)
    request = urllib.request.Request(emu.url + "/api/v1/namespaces/default/secrets", body, method="POST", headers={
        "Content-Type": "application/vnd.kubernetes.protobuf", "Accept": "application/vnd.kubernetes.protobuf,"
                                                                          "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 201 and resp.headers["Content-Type"].startswith("application/json")
    stored = emu.get("v1", "Secret", "release") or {}
    assert stored["metadata"]["labels"] == {"owner": "helm"} and stored["type"] == "helm.sh/x"
    assert base64.b64decode(stored["data"]["release"]) == b"\x00\xffdata"


def test_protobuf_of_other_kinds_is_refused_with_415(emu: Emulator) -> None:
    body = b"k8s\x00" + _field(1, _field(1, b"v1") + _field(2, b"Pod")) + _field(2, b"")
    request = urllib.request.Request(emu.url + "/api/v1/namespaces/default/pods", body, method="POST",
                                     headers={"Content-Type": "application/vnd.kubernetes.protobuf"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 415
