"""The mock engine's fault endpoints (``/infera/faults``, ``/infera/requests``; see :mod:`.faults`)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from infera.engine.mock.faults import Faults
from infera.engine.mock.responses import json_body, json_response
from infera.engine.mock.service import ApiError


class FaultEndpoints:
    def __init__(self, faults: Faults, on_change: Callable[[], None]) -> None:
        self.f = faults
        self._on_change = on_change

    async def get(self, request: Request) -> Response:
        return json_response(self.f.state())

    async def post(self, request: Request) -> Response:
        try:
            self.f.apply(await json_body(request))
        except ValueError as exc:
            message, param = exc.args
            raise ApiError(message, param=param) from exc
        self._on_change()
        return json_response(self.f.state())

    async def requests(self, request: Request) -> Response:
        return json_response({"requests": dict(self.f.ledger), "total": self.f.total})
