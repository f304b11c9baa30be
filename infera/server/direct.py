"""Direct mode's default worker: a request naming no worker goes to the one this frontend was given."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

WORKER_HEADER = b"x-worker-instance-id"


def with_default_worker(headers: list[tuple[bytes, bytes]], header: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``header`` appended (a new list) unless a header of its name is there already
    (then ``headers`` itself)."""
    if any(k == header[0] for k, _ in headers):
        return headers
    return [*headers, header]


class DefaultWorkerHeader:
    """Direct mode: a request naming no worker in x-worker-instance-id goes to ``worker``.

    The frontend sidecar of a worker pod runs with its own pod's worker here: a stock GAIE endpoint
    picker names the pod (by address), not the worker, so a request it sends to the pod must be
    served by that pod's worker.
    """

    def __init__(self, app: ASGIApp, worker: str) -> None:
        self.app = app
        self.header = (WORKER_HEADER, worker.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = with_default_worker(scope["headers"], self.header)
            if headers is not scope["headers"]:
                scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)
