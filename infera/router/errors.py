"""Why a request could not be routed, in the router's words; the server maps each to its API's status.

Nothing here knows HTTP: :mod:`infera.server.errors` turns each kind into the status and
error body of the API the client called (OpenAI or Anthropic).
"""

from __future__ import annotations

__all__ = ["BadDirectHeaders", "NoWorkers", "NotServable", "RoutingError", "UnknownWorker", "UpstreamFailed"]


class RoutingError(Exception):
    """The request cannot be routed; ``str(error)`` is the message the client reads."""


class NoWorkers(RoutingError):
    """No worker (or pair) of the model can take the request now: the fleet is empty, lacks the
    role or connector the request needs, or every candidate failed before its first byte."""


class UnknownWorker(RoutingError):
    """Direct mode: a header names a worker that is not in the fleet (not registered, not ready, gone)."""


class BadDirectHeaders(RoutingError):
    """Direct mode: the headers name workers that cannot serve this request together (wrong model,
    wrong role, mismatched connectors)."""


class NotServable(RoutingError):
    """The only workers of the model cannot take this kind of request (e.g. an ATOM prefill/decode
    pair and a chat request: it takes chat only as a text completion)."""


class UpstreamFailed(RoutingError):
    """Every attempt failed before its first byte; ``status`` is the transport's verdict on the
    last one (502 unreachable or broken, 504 timed out, 429 busy)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
