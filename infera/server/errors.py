"""Error responses in the shape of the API the client called, and the handlers that make every failure use it.

The router's errors (:mod:`infera.router.errors`) carry meaning only; :func:`routing_status`
gives each its HTTP status, and :func:`openai_error` / :func:`anthropic_error` its body.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from infera.protocols.anthropic import error_body as anthropic_error_body
from infera.protocols.openai import error_body
from infera.router.errors import BadDirectHeaders, NotServable, RoutingError, UpstreamFailed
from infera.server.responses import JsonResponse

ANTHROPIC_PREFIX = "/v1/messages"

STATUS_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}

ANTHROPIC_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error",
                   529: "overloaded_error"}


def routing_status(exc: RoutingError) -> tuple[int, str]:
    """The HTTP status and OpenAI error type of a routing failure."""
    if isinstance(exc, UpstreamFailed):
        return exc.status, "upstream_error"
    if isinstance(exc, BadDirectHeaders | NotServable):
        return 400, "invalid_request_error"
    return 503, "service_unavailable"  # NoWorkers, UnknownWorker: nobody can take it now


def openai_error(status: int, message: str, kind: str | None = None, param: str | None = None) -> JsonResponse:
    return JsonResponse(error_body(message, kind or STATUS_KINDS.get(status, "server_error"), param, status),
                        status_code=status)


def openai_routing_error(exc: RoutingError) -> JsonResponse:
    status, kind = routing_status(exc)
    return openai_error(status, str(exc), kind)


def anthropic_status(status: int) -> tuple[int, str]:
    """The status and error type Anthropic uses for a failure we saw as ``status``."""
    if status == 503:
        return 529, "overloaded_error"  # no worker can take it: Anthropic's "overloaded"
    if status in ANTHROPIC_KINDS:
        return status, ANTHROPIC_KINDS[status]
    return (400, "invalid_request_error") if 400 <= status < 500 else (500, "api_error")


def anthropic_error(status: int, message: str) -> JsonResponse:
    status, kind = anthropic_status(status)
    return JsonResponse(anthropic_error_body(kind, message), status_code=status)


def anthropic_routing_error(exc: RoutingError) -> JsonResponse:
    return anthropic_error(routing_status(exc)[0], str(exc))


def api_error(request: Request, status: int, message: str) -> JsonResponse:
    """An error in the shape of the API the client called: Anthropic's under /v1/messages, else OpenAI's."""
    if request.url.path.startswith(ANTHROPIC_PREFIX):
        _, kind = anthropic_status(status)
        return JsonResponse(anthropic_error_body(kind, message), status_code=status)
    return openai_error(status, message)


def install_error_handlers(app: FastAPI) -> None:
    async def http_error(request: Request, exc: Exception) -> JsonResponse:
        assert isinstance(exc, StarletteHTTPException)
        return api_error(request, exc.status_code, str(exc.detail))

    async def validation_error(request: Request, exc: Exception) -> JsonResponse:
        return api_error(request, 400, str(exc))

    async def unexpected(request: Request, exc: Exception) -> JsonResponse:
        return api_error(request, 500, f"internal error: {type(exc).__name__}")

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)
