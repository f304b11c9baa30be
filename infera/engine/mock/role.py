"""The seam for prefill/decode roles (``--role``, ``--connector``).

Every OpenAI request passes through its worker's role on the way in and out:
:meth:`Role.admit` shapes the planned output, :meth:`Role.receive_kv` waits for KV that a
prefill worker computed (and says how many prompt tokens it covers, so the scheduler skips
their compute), :meth:`Role.submitted` sees the queued request, and
:meth:`Role.response_extras` adds top-level response fields. ``mixed`` does nothing at any
of them; the prefill and decode roles live in :mod:`infera.engine.mock.pd`.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.routing import BaseRoute

from infera.engine.mock.engine import RequestHandle
from infera.engine.mock.text import PlannedOutput


class Role(Protocol):
    name: str

    def admit(self, body: dict[str, Any], prompt_ids: list[int], output: PlannedOutput) -> PlannedOutput:
        """Shape a request before scheduling (a prefill worker cuts the output to one token)."""
        ...

    async def receive_kv(self, body: dict[str, Any], prompt_ids: list[int]) -> int:
        """Wait for the prompt's KV from a prefill worker, if the body asks for it.

        Returns the number of leading prompt tokens whose KV arrived (0: compute them all);
        raises :class:`~infera.engine.mock.service.ApiError` (502) when the transfer fails.
        """
        ...

    def submitted(self, body: dict[str, Any], handle: RequestHandle) -> None:
        """The request is queued (a push prefill worker opens its bootstrap room here)."""
        ...

    def response_extras(self, body: dict[str, Any], handle: RequestHandle) -> dict[str, Any]:
        """Extra top-level fields of a non-streamed response (e.g. ``kv_transfer_params``)."""
        ...

    def routes(self) -> list[BaseRoute]:
        """Extra HTTP routes (a push prefill worker serves its bootstrap rooms)."""
        ...


class MixedRole:
    name = "mixed"

    def admit(self, body: dict[str, Any], prompt_ids: list[int], output: PlannedOutput) -> PlannedOutput:
        return output

    async def receive_kv(self, body: dict[str, Any], prompt_ids: list[int]) -> int:
        return 0

    def submitted(self, body: dict[str, Any], handle: RequestHandle) -> None:
        return None

    def response_extras(self, body: dict[str, Any], handle: RequestHandle) -> dict[str, Any]:
        return {}

    def routes(self) -> list[BaseRoute]:
        return []
