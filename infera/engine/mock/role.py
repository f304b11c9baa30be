"""The seam for prefill/decode roles (``--role``).

Every request passes through the role's :meth:`Role.admit` before it reaches the scheduler
and through :meth:`Role.response_extras` on its way out. ``mixed`` does both prefill and
decode and adds nothing. The prefill/decode issue fills in the other two: a ``prefill``
worker will stop after the first token and answer with ``kv_transfer_params`` (vLLM pull)
or accept SGLang bootstrap fields (push); a ``decode`` worker will take those params and
skip the prefill cost of the transferred blocks. Until then they behave as ``mixed``.
"""

from __future__ import annotations

from typing import Any, Protocol

from infera.engine.mock.text import PlannedOutput


class Role(Protocol):
    name: str

    def admit(self, body: dict[str, Any], prompt_ids: list[int], output: PlannedOutput) -> PlannedOutput:
        """Shape a request before scheduling (e.g. cut the output to one token on a prefill worker)."""
        ...

    def response_extras(self, body: dict[str, Any]) -> dict[str, Any]:
        """Extra top-level response fields (e.g. ``kv_transfer_params``)."""
        ...


class MixedRole:
    def __init__(self, name: str = "mixed") -> None:
        self.name = name

    def admit(self, body: dict[str, Any], prompt_ids: list[int], output: PlannedOutput) -> PlannedOutput:
        return output

    def response_extras(self, body: dict[str, Any]) -> dict[str, Any]:
        return {}


ROLES: dict[str, type[MixedRole]] = {"mixed": MixedRole, "prefill": MixedRole, "decode": MixedRole}


def make_role(name: str) -> Role:
    return ROLES[name](name)
