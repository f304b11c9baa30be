"""Error responses in the OpenAI shape, and the handlers that make every failure use it."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from infera.protocols.anthropic import error_body as anthropic_error_body
from infera.protocols.openai import error_body
from infera.server.anthropic_api import PATH as ANTHROPIC_PREFIX
from infera.server.anthropic_api import anthropic_status
from infera.server.responses import JsonResponse

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


def openai_error(status: int, message: str, kind: str | None = None, param: str | None = None) -> JsonResponse:
    return JsonResponse(error_body(message, kind or STATUS_KINDS.get(status, "server_error"), param, status),
                          status_code=status)


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
