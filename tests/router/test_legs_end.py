"""A mixed request's end: its response closes the upstream once and ends the load ticket, with or without a telemetry
record bound (the ticket's end is then a closure ending the leg's span too, else the tracker's end alone)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from infera.protocols.worker import WorkerRecord
from infera.router.router import Router, RouterOptions
from infera.telemetry.record import RequestRecord, bind, unbind
from infera.transport.base import UpstreamResponse
from tests.fakes import FakeFleet, FakeTransport, chat_request, worker


class CountingTransport(FakeTransport):
    """FakeTransport whose responses count the calls of their close, open or already closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closes: list[int] = []

    async def send(self, worker: WorkerRecord, path: str, body: bytes, headers: Mapping[str, str],
                   started: float | None = None) -> UpstreamResponse:
        upstream = await super().send(worker, path, body, headers, started)
        k = len(self.closes)
        self.closes.append(0)
        inner = upstream.close

        def close() -> None:
            self.closes[k] += 1
            inner()

        upstream.close = close  # type: ignore[method-assign]
        return upstream


@pytest.mark.parametrize("recorded", [False, True])
@pytest.mark.parametrize("read", ["chunks", "close"])
async def test_a_mixed_response_closes_its_upstream_once_and_ends_its_ticket(recorded: bool, read: str) -> None:
    transport = CountingTransport()
    router = Router(FakeFleet(worker("m1"), worker("m2")), transport, None, None,
                    RouterOptions(policy="round-robin"), rng=random.Random(7))
    token: Any = bind(RequestRecord("r1", "")) if recorded else None
    try:
        for _ in range(3):
            routed = await router.dispatch(chat_request(), {})
            assert sum(w.in_flight for w in router.view.workers()) == 1
            if read == "chunks":
                assert b"".join([c async for c in routed.chunks()])
            routed.close()
            routed.close()  # idempotent
            assert sum(w.in_flight for w in router.view.workers()) == 0
    finally:
        if token is not None:
            unbind(token)
    # one close per RoutedResponse.close (the chunks' end closes it once more): none from the ticket's end
    assert transport.closes == [3 if read == "chunks" else 2] * 3 and transport.open == 0
