"""Kubernetes' protobuf encoding, read for the two kinds Go clients send that way here: Secret and ConfigMap.

Helm's Go client (client-go) writes its release records (Secrets, or ConfigMaps with the configmap
storage driver) as ``application/vnd.kubernetes.protobuf``. The API server answers those clients in JSON
(they accept ``application/json`` too), so only request bodies need decoding: the ``k8s\\0`` envelope
(``runtime.Unknown``: type meta + raw bytes), then the object by the field numbers of
k8s.io/api/core/v1/generated.proto and apimachinery's ObjectMeta. Fields a release record never
carries (managed fields, a deletion timestamp) are skipped.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from infera.picker.wire import fields

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    pass


def _map(entries: list[bytes], binary: bool) -> dict[str, str]:
    out = {}
    for entry in entries:
        parts = {n: v for n, _, v in fields(entry)}
        value = parts.get(2, b"")
        out[parts.get(1, b"").decode()] = base64.b64encode(value).decode() if binary else value.decode()
    return out


def _time(data: bytes) -> str:
    seconds = next((v for n, _, v in fields(data) if n == 1), 0)
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner(data: bytes) -> dict[str, Any]:
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion", 6: "controller", 7: "blockOwnerDeletion"}
    return {names[n]: (bool(v) if n in (6, 7) else v.decode()) for n, _, v in fields(data) if n in names}


def _meta(data: bytes) -> dict[str, Any]:
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    meta: dict[str, Any] = {}
    labels: list[bytes] = []
    annotations: list[bytes] = []
    for n, _, v in fields(data):
        if n in strings and v:
            meta[strings[n]] = v.decode()
        elif n == 8 and v:
            meta["creationTimestamp"] = _time(v)
        elif n == 11:
            labels.append(v)
        elif n == 12:
            annotations.append(v)
        elif n == 13:
            meta.setdefault("ownerReferences", []).append(_owner(v))
        elif n == 14:
            meta.setdefault("finalizers", []).append(v.decode())
    if labels:
        meta["labels"] = _map(labels, binary=False)
    if annotations:
        meta["annotations"] = _map(annotations, binary=False)
    return meta


def _secret(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret"}
    data, string_data = [], []
    for n, _, v in fields(raw):
        if n == 1:
            obj["metadata"] = _meta(v)
        elif n == 2:
            data.append(v)
        elif n == 3:
            obj["type"] = v.decode()
        elif n == 4:
            string_data.append(v)
        elif n == 5:
            obj["immutable"] = bool(v)
    if data:
        obj["data"] = _map(data, binary=True)
    if string_data:
        obj["stringData"] = _map(string_data, binary=False)
    return obj


def _config_map(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap"}
    data, binary = [], []
    for n, _, v in fields(raw):
        if n == 1:
            obj["metadata"] = _meta(v)
        elif n == 2:
            data.append(v)
        elif n == 3:
            binary.append(v)
        elif n == 4:
            obj["immutable"] = bool(v)
    if data:
        obj["data"] = _map(data, binary=False)
    if binary:
        obj["binaryData"] = _map(binary, binary=True)
    return obj


DECODERS = {"Secret": _secret, "ConfigMap": _config_map}


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded object as the JSON the API would hold; :class:`ProtobufError` for other kinds."""
    if not body.startswith(MAGIC):
        raise ProtobufError("not a Kubernetes protobuf message (no k8s\\0 prefix)")
    envelope = {n: v for n, _, v in fields(body[len(MAGIC):])}
    type_meta = {n: v.decode() for n, _, v in fields(envelope.get(1, b""))}
    kind = type_meta.get(2, "")
    if type_meta.get(1) != "v1" or kind not in DECODERS:
        raise ProtobufError(f"protobuf is understood here for v1 {', '.join(DECODERS)} only, not {kind or 'this'}")
    return DECODERS[kind](envelope.get(2, b""))
