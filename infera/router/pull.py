"""Serial pull (vLLM NixlConnector): prefill with one output token, then decode with its params.

The prefill leg gets the body with ``max_tokens: 1`` (and ``max_completion_tokens: 1`` if
set), ``stream: false``, no ``stream_options``, and ``kv_transfer_params`` asking for a
remote decode. Its JSON answer carries ``kv_transfer_params`` (``do_remote_prefill``,
``remote_engine_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``, ...) that the
decode leg gets with the client's original body, and pulls the KV with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infera.router.connector import Pair

REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class PullConnector:
    name = "pull"
    concurrent = False

    def prefill_body(self, payload: Mapping[str, Any], pair: Pair) -> dict[str, Any]:
        body = {k: v for k, v in payload.items() if k != "stream_options"}
        body["max_tokens"] = 1
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = 1
        body["stream"] = False
        body["kv_transfer_params"] = dict(REMOTE_DECODE)
        return body

    def decode_body(self, payload: Mapping[str, Any], pair: Pair,
                    prefill_response: Mapping[str, Any] | None) -> dict[str, Any]:
        params = prefill_response.get("kv_transfer_params") if prefill_response else None
        if not isinstance(params, dict) or not params:
            return dict(payload)  # the prefill engine sent none: the decode worker computes the prompt
        return {**payload, "kv_transfer_params": params}
