"""The connector seam: how a prefill/decode pair's two request bodies are shaped.

A connector is pure: it turns the client's parsed body into the body each leg gets, and
says whether the legs run at once (``concurrent``: push, the decode worker waits for the
KV itself) or one after the other (the decode body needs the prefill worker's answer).
Running the legs, load accounting and retries are the router's
(:mod:`infera.router.disagg`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from infera.protocols.worker import WorkerRecord


@dataclasses.dataclass(frozen=True, slots=True)
class Pair:
    prefill: WorkerRecord
    decode: WorkerRecord
    room: int  # fresh per attempt: SGLang's bootstrap_room, 0 <= room < 2**63


class Connector(Protocol):
    name: str
    concurrent: bool  # True: both legs at once; False: prefill to the end, then decode

    def prefill_body(self, payload: Mapping[str, Any], pair: Pair) -> dict[str, Any]:
        """The prefill leg's body (its response is read by the router, never by the client)."""
        ...

    def decode_body(self, payload: Mapping[str, Any], pair: Pair,
                    prefill_response: Mapping[str, Any] | None) -> dict[str, Any]:
        """The decode leg's body; ``prefill_response`` is the prefill JSON (serial connectors only)."""
        ...
