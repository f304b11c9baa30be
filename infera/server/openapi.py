"""The OpenAPI document the server publishes at ``/openapi.json``: real request and response schemas.

The inference handlers read their raw request themselves (no FastAPI body parameters, for speed),
so FastAPI alone publishes them without bodies, or not at all. This fills in each JSON
endpoint's request body (the same pydantic models the handlers validate with), every status
it answers with its body in the API's own shape (OpenAI's error object, or Anthropic's), the
``x-request-id`` header on every answer, and the admin token as a bearer security scheme on
the admin paths when one is set. The served models are the ``model`` examples, so a client
generating requests from the document (schemathesis) reaches the routing path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from infera.protocols.anthropic import CountTokensRequest, MessagesRequest
from infera.protocols.openai import ChatCompletionRequest, CompletionRequest
from infera.server.auth import is_admin_path
from infera.server.prewarm import PrewarmRequest

REF = "#/components/schemas/{model}"
JSON = "application/json"
SSE = "text/event-stream"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _obj(required: Sequence[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": props}


STR, INT = {"type": "string"}, {"type": "integer"}
NULLABLE_STR = {"type": ["string", "null"]}
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": STR, "event": STR}}  # one event

RESPONSE_SCHEMAS: dict[str, dict[str, Any]] = {
    "OpenAIError": _obj(["error"], error=_obj(["message", "type"], message=STR, type=STR,
                                              param=NULLABLE_STR, code={"type": ["string", "integer", "null"]})),
    "AnthropicError": _obj(["type", "error"], type={"const": "error"}, request_id=STR,
                           error=_obj(["type", "message"], type=STR, message=STR)),
    "ChatCompletion": _obj(["id", "object", "choices"], id=STR, object={"const": "chat.completion"},
                           choices={"type": "array", "items": _obj(["index"], index=INT)}),
    "Completion": _obj(["id", "object", "choices"], id=STR, object={"const": "text_completion"},
                       choices={"type": "array", "items": _obj(["index", "text"], index=INT, text=STR)}),
    "Message": _obj(["id", "type", "role", "content", "model", "stop_reason", "usage"], id=STR,
                    type={"const": "message"}, role={"const": "assistant"}, model=STR, stop_reason=NULLABLE_STR,
                    content={"type": "array", "items": _obj(["type"], type=STR)},
                    usage=_obj(["input_tokens", "output_tokens"], input_tokens=INT, output_tokens=INT)),
    "TokenCount": _obj(["input_tokens"], input_tokens=INT),
    "PrewarmAccepted": _obj(["object", "worker", "model", "prompt_tokens", "block_size", "blocks"],
                            object={"const": "cache.prewarm"}, worker=STR, model=STR, prompt_tokens=INT,
                            block_size=INT, blocks=INT, priority=INT),
    "ProfileRequest": {"type": "object", "additionalProperties": True,
                       "properties": {"workers": {"type": "array", "minItems": 1, "items": STR}}},
    "ProfileResult": _obj(["action", "ok", "succeeded", "failed", "workers"], action=STR, ok={"type": "boolean"},
                          succeeded=INT, failed=INT,
                          workers={"type": "array", "items": _obj(["worker_id", "ok"], worker_id=STR,
                                                                  ok={"type": "boolean"})}),
    "ModelList": _obj(["object", "data"], object={"const": "list"},
                      data={"type": "array", "items": _obj(["id", "object"], id=STR, object={"const": "model"})}),
    "Health": _obj(["status", "workers", "models"], status={"enum": ["ok", "no_workers"]}, workers=INT,
                   models={"type": "array", "items": STR}),
    "Live": _obj(["status"], status={"const": "ok"}),
    "WorkerList": _obj(["object", "data"], object={"const": "list"},
                       data={"type": "array", "items": _obj(["instance_id", "model", "in_flight"], instance_id=STR,
                                                            model=STR, in_flight=INT)}),
    "CacheView": _obj(["worker_id"], worker_id=STR),
}

OPENAI_ERRORS = (400, 404, 408, 413, 429, 502, 503, 504)
ANTHROPIC_ERRORS = (400, 404, 408, 413, 429, 500, 504, 529)
REQUEST_ID = {"x-request-id": {"description": "the request's id: the client's x-request-id, else one made here",
                               "required": True, "schema": STR}}

# path -> (request body schema or None, {status: (schema name, media types)})
Answers = dict[int | str, tuple[str, tuple[str, ...]]]


def _errors(statuses: Sequence[int], schema: str) -> Answers:
    return {s: (schema, (JSON,)) for s in statuses}


OPERATIONS: dict[tuple[str, str], tuple[str | None, Answers]] = {
    ("post", "/v1/chat/completions"): ("ChatCompletionRequest",
                                       {200: ("ChatCompletion", (JSON, SSE)), **_errors(OPENAI_ERRORS, "OpenAIError")}),
    ("post", "/v1/completions"): ("CompletionRequest",
                                  {200: ("Completion", (JSON, SSE)), **_errors(OPENAI_ERRORS, "OpenAIError")}),
    ("post", "/v1/messages"): ("MessagesRequest",
                               {200: ("Message", (JSON, SSE)), **_errors(ANTHROPIC_ERRORS, "AnthropicError")}),
    ("post", "/v1/messages/count_tokens"): ("CountTokensRequest",
                                            {200: ("TokenCount", (JSON,)),
                                             **_errors(ANTHROPIC_ERRORS, "AnthropicError")}),
    ("post", "/v1/cache/prewarm"): ("PrewarmRequest", {202: ("PrewarmAccepted", (JSON,)),
                                                       **_errors((400, 401, 404, 408, 413, 503), "OpenAIError")}),
    ("post", "/v1/admin/profile/start"): ("ProfileRequest", {
        200: ("ProfileResult", (JSON,)), 207: ("ProfileResult", (JSON,)), 502: ("ProfileResult", (JSON,)),
        "4XX": ("ProfileOrError", (JSON,)), 503: ("OpenAIError", (JSON,))}),
    ("get", "/v1/models"): (None, {200: ("ModelList", (JSON,))}),
    ("get", "/health"): (None, {200: ("Health", (JSON,)), 503: ("Health", (JSON,))}),
    ("get", "/livez"): (None, {200: ("Live", (JSON,))}),
    ("get", "/v1/workers"): (None, {200: ("WorkerList", (JSON,))}),
    ("get", "/v1/admin/cache-view/{worker_id}"): (None, {200: ("CacheView", (JSON,)),
                                                         **_errors((401, 404), "OpenAIError")}),
}
OPERATIONS[("post", "/v1/admin/profile/stop")] = OPERATIONS[("post", "/v1/admin/profile/start")]
REQUEST_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionRequest, CompletionRequest, MessagesRequest,
                                               CountTokensRequest, PrewarmRequest)


def document(app: FastAPI, models: Sequence[str], admin_token: bool) -> dict[str, Any]:
    """The full OpenAPI 3.1 document of ``app``; ``models`` are the served models (examples only)."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description="infera: an OpenAI- and Anthropic-compatible frontend and KV-aware router")
    _, defs = models_json_schema([(m, "validation") for m in REQUEST_MODELS], ref_template=REF)
    schemas: dict[str, Any] = {**defs["$defs"], **RESPONSE_SCHEMAS}
    schemas["ProfileOrError"] = {"anyOf": [_ref("ProfileResult"), _ref("OpenAIError")]}
    for name in ("ChatCompletionRequest", "CompletionRequest", "MessagesRequest", "CountTokensRequest",
                 "PrewarmRequest"):
        schemas[name]["properties"]["model"]["examples"] = list(models)
    doc.setdefault("components", {})["schemas"] = schemas
    if admin_token:
        doc["components"]["securitySchemes"] = {"adminToken": {"type": "http", "scheme": "bearer"}}
    paths: dict[str, Any] = doc.setdefault("paths", {})
    for (method, path), (body, answers) in OPERATIONS.items():
        op = paths.setdefault(path, {}).setdefault(method, {"operationId": f"{method}_{path}"})
        op.pop("requestBody", None)
        if body is not None:
            op["requestBody"] = {"required": True, "content": {JSON: {"schema": _ref(body)}}}
        if admin_token and is_admin_path(path):
            op["security"] = [{"adminToken": []}]
            answers = {**answers, 401: ("OpenAIError", (JSON,))}
        op["responses"] = {str(status): {"description": _describe(status), "headers": REQUEST_ID,
                                         "content": {media: {"schema": _ref(name) if media == JSON else SSE_EVENT}
                                                     for media in types}}
                           for status, (name, types) in answers.items()}
    paths.setdefault("/metrics", {}).setdefault("get", {})["responses"] = {
        "200": {"description": "Prometheus exposition", "headers": REQUEST_ID,
                "content": {"text/plain": {"schema": STR}}}}
    return doc


def _describe(status: int | str) -> str:
    return {200: "OK", 202: "accepted", 207: "some workers failed", "4XX": "a client error"}.get(
        status, "an error in the API's shape")


def install_openapi(app: FastAPI, models: Callable[[], Sequence[str]], admin_token: bool) -> None:
    """Serve :func:`document` at ``/openapi.json``, with the models served at the time of the request."""
    def openapi() -> dict[str, Any]:
        return document(app, models(), admin_token)

    app.openapi = openapi  # type: ignore[method-assign]
