"""The ext_proc v3 messages the picker reads and writes (envoy-data-plane's betterproto2 classes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from envoy_data_plane.envoy.config.core.v3 import (
    HeaderMap,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    Metadata,
)
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ImmediateResponse,
    ProcessingResponse,
    TrailersResponse,
)
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
from envoy_data_plane.google.protobuf import Struct

SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"


def header_dict(headers: HeaderMap | None) -> dict[str, str]:
    """Lower-case name -> value (Envoy sends values as raw bytes unless told otherwise)."""
    if headers is None:
        return {}
    return {h.key.lower(): h.raw_value.decode("latin-1") if h.raw_value else h.value for h in headers.headers}


def metadata_value(metadata: Metadata | None, namespace: str, key: str) -> object:
    if metadata is None:
        return None
    struct = metadata.filter_metadata.get(namespace)
    if struct is None:
        return None
    return struct.to_dict().get(key)


def subset(metadata: Metadata | None, namespace: str) -> list[str] | None:
    """The endpoints the proxy allows (None when it passes no subset)."""
    value = metadata_value(metadata, namespace, SUBSET_KEY)
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def _mutation(headers: Mapping[str, str]) -> HeaderMutation:
    return HeaderMutation(set_headers=[
        HeaderValueOption(header=HeaderValue(key=k, raw_value=v.encode()),
                          append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD)
        for k, v in headers.items()])


def route_to(headers: Mapping[str, str], metadata: Mapping[str, Mapping[str, str]], *, body_phase: bool
             ) -> ProcessingResponse:
    """Continue with ``headers`` set on the request and ``metadata`` as dynamic metadata."""
    common = CommonResponse(header_mutation=_mutation(headers), clear_route_cache=True)
    dynamic = Struct.from_dict({ns: dict(values) for ns, values in metadata.items()})
    if body_phase:
        return ProcessingResponse(request_body=BodyResponse(response=common), dynamic_metadata=dynamic)
    return ProcessingResponse(request_headers=HeadersResponse(response=common), dynamic_metadata=dynamic)


def continue_request_headers() -> ProcessingResponse:
    return ProcessingResponse(request_headers=HeadersResponse(response=CommonResponse()))


def continue_response_headers() -> ProcessingResponse:
    return ProcessingResponse(response_headers=HeadersResponse(response=CommonResponse()))


def continue_response_body() -> ProcessingResponse:
    return ProcessingResponse(response_body=BodyResponse(response=CommonResponse()))


def continue_trailers(response: bool) -> ProcessingResponse:
    if response:
        return ProcessingResponse(response_trailers=TrailersResponse())
    return ProcessingResponse(request_trailers=TrailersResponse())


def immediate(status: int, body: bytes, details: str,
              headers: Sequence[tuple[str, str]] = (("content-type", "application/json"),)) -> ProcessingResponse:
    """Answer the client now, without any upstream."""
    return ProcessingResponse(immediate_response=ImmediateResponse(
        status=HttpStatus(code=StatusCode(status)), headers=_mutation(dict(headers)), body=body,
        details=details.replace(" ", "_")[:120]))
