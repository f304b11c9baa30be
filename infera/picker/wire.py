"""The ext_proc v3 messages the picker reads and writes, on the protobuf wire, by hand.

envoy-data-plane's generated classes validate every field through pydantic: parsing the five
messages of one request took ~3 ms of CPU, more than routing it. The picker reads a handful of
fields and writes a handful, so it decodes and encodes just those (field numbers from
envoy/service/ext_proc/v3/external_processor.proto, envoy/config/core/v3/base.proto and
google/protobuf/struct.proto); the tests check both directions against envoy-data-plane.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# ProcessingRequest's oneof "request": field number -> name
PHASES = {2: "request_headers", 3: "response_headers", 4: "request_body", 5: "response_body",
          6: "request_trailers", 7: "response_trailers"}
METADATA_CONTEXT = 8
OVERWRITE_IF_EXISTS_OR_ADD = 2


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value): an int for varints, bytes for length-delimited fields."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _header_map(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for number, _, header in fields(data):
        if number != 1:
            continue
        key = value = ""
        raw = b""
        for n, _, v in fields(header):
            if n == 1:
                key = v.decode()
            elif n == 2:
                value = v.decode()
            elif n == 3:
                raw = v
        out[key.lower()] = raw.decode("latin-1") if raw else value
    return out


def _value(data: bytes) -> Any:
    for number, _, v in fields(data):
        if number == 1:
            return None
        if number == 2:
            return struct.unpack("<d", v)[0]
        if number == 3:
            return v.decode()
        if number == 4:
            return bool(v)
        if number == 5:
            return _struct(v)
        if number == 6:
            return [_value(item) for n, _, item in fields(v) if n == 1]
    return None


def _struct(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, _, entry in fields(data):
        if number != 1:
            continue
        key, value = "", None
        for n, _, v in fields(entry):
            if n == 1:
                key = v.decode()
            elif n == 2:
                value = _value(v)
        out[key] = value
    return out


def _metadata(data: bytes) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for number, _, entry in fields(data):
        if number != 1:  # filter_metadata: map<string, Struct>
            continue
        key, value = "", {}
        for n, _, v in fields(entry):
            if n == 1:
                key = v.decode()
            elif n == 2:
                value = _struct(v)
        out[key] = value
    return out


@dataclasses.dataclass(slots=True)
class Request:
    """One ProcessingRequest: its phase and what the picker reads of it."""

    phase: str = ""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""
    end_of_stream: bool = False
    metadata: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def FromString(cls, data: bytes) -> Request:
        req = cls()
        for number, _, value in fields(data):
            phase = PHASES.get(number)
            if phase is not None:
                req.phase = phase
                for n, wire, v in fields(value):
                    if phase.endswith("_headers"):  # HttpHeaders: headers 1, end_of_stream 3
                        if n == 1:
                            req.headers = _header_map(v)
                        elif n == 3:
                            req.end_of_stream = bool(v)
                    elif phase.endswith("_body"):  # HttpBody: body 1, end_of_stream 2
                        if n == 1:
                            req.body = v
                        elif n == 2 and wire == 0:
                            req.end_of_stream = bool(v)
                    elif n == 1:  # HttpTrailers: trailers 1
                        req.headers = _header_map(v)
            elif number == METADATA_CONTEXT:
                req.metadata = _metadata(value)
        return req


# ---- encoding ------------------------------------------------------------------------------------

def _key(number: int, wire: int) -> bytes:
    return _uvarint(number << 3 | wire)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _uvarint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return _key(number, 0) + _uvarint(value) if value else b""


def _struct_bytes(values: Mapping[str, Any]) -> bytes:
    out = bytearray()
    for k, v in values.items():
        if isinstance(v, Mapping):
            value = _len(5, _struct_bytes(v))
        elif isinstance(v, str):
            value = _len(3, v.encode())
        else:
            raise TypeError(f"unsupported metadata value {v!r}")
        out += _len(1, _len(1, k.encode()) + _len(2, value))
    return bytes(out)


def _mutation(headers: Sequence[tuple[str, str]]) -> bytes:
    """HeaderMutation.set_headers: HeaderValueOption{header: HeaderValue{key, raw_value}, append_action}."""
    return b"".join(_len(1, _len(1, _len(1, k.encode()) + _len(3, v.encode()))
                         + _int(3, OVERWRITE_IF_EXISTS_OR_ADD)) for k, v in headers)


@dataclasses.dataclass(slots=True)
class Reply:
    """One encoded ProcessingResponse."""

    data: bytes

    def SerializeToString(self) -> bytes:
        return self.data


PHASE_REPLY = {"request_headers": 1, "response_headers": 2, "request_body": 3, "response_body": 4,
               "request_trailers": 5, "response_trailers": 6}


def proceed(phase: str) -> Reply:
    """Continue unchanged (an empty CommonResponse, or an empty TrailersResponse)."""
    inner = b"" if phase.endswith("_trailers") else _len(1, b"")
    return Reply(_len(PHASE_REPLY[phase], inner))


def route_to(phase: str, headers: Sequence[tuple[str, str]], metadata: Mapping[str, Mapping[str, str]]) -> Reply:
    """Continue with ``headers`` set on the request (route cache cleared) and ``metadata`` emitted."""
    common = _len(2, _mutation(headers)) + _int(5, 1)
    return Reply(_len(PHASE_REPLY[phase], _len(1, common)) + _len(8, _struct_bytes(metadata)))


def immediate(status: int, body: bytes, details: str,
              headers: Sequence[tuple[str, str]] = (("content-type", "application/json"),)) -> Reply:
    """Answer the client now: ImmediateResponse{status: HttpStatus{code}, headers, body, details}."""
    inner = (_len(1, _int(1, status)) + _len(2, _mutation(headers)) + _len(3, body)
             + _len(5, details.replace(" ", "_")[:120].encode()))
    return Reply(_len(7, inner))
