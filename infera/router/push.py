"""Concurrent push (SGLang): the same body to both workers at once, plus bootstrap fields.

Both legs carry ``bootstrap_host`` and ``bootstrap_port`` (the prefill worker's bootstrap
server, from its record's ``bootstrap_addr``) and a fresh random ``bootstrap_room``; the
decode worker joins the room and the prefill worker pushes the prompt's KV into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from infera.protocols.worker import WorkerRecord
from infera.router.connector import Pair

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port


def bootstrap_address(worker: WorkerRecord) -> tuple[str, int]:
    """``(host, port)`` of a prefill worker's bootstrap server: its record, else its HTTP host and 8998."""
    if worker.bootstrap_addr:
        host, _, port = worker.bootstrap_addr.rpartition(":")
        if host and port.isdigit():
            return host.strip("[]"), int(port)
        return worker.bootstrap_addr, DEFAULT_BOOTSTRAP_PORT
    return urlsplit(worker.http_url).hostname or "127.0.0.1", DEFAULT_BOOTSTRAP_PORT


class PushConnector:
    name = "push"
    concurrent = True

    def _with_bootstrap(self, payload: Mapping[str, Any], pair: Pair) -> dict[str, Any]:
        host, port = bootstrap_address(pair.prefill)
        return {**payload, "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": pair.room}

    def prefill_body(self, payload: Mapping[str, Any], pair: Pair) -> dict[str, Any]:
        return self._with_bootstrap(payload, pair)

    def decode_body(self, payload: Mapping[str, Any], pair: Pair,
                    prefill_response: Mapping[str, Any] | None) -> dict[str, Any]:
        return self._with_bootstrap(payload, pair)
