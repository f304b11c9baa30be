"""The router's assembly (infera.router.assembly): what it prepares before the server takes requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from infera.config.server import ServerSettings
from infera.router.assembly import assemble


@pytest.mark.parametrize(("policy", "learnt"), [("kv-aware", 11), ("round-robin", 0)])
def test_a_tokenizing_policy_starts_with_the_common_chats_recipes(tiny_tokenizer_dir: Path, policy: str,
                                                                  learnt: int) -> None:
    settings = ServerSettings(router_policy=policy, discovery_backend="static", worker_url=("http://x",),
                              request_transport="http", kv_event_transport="zmq",
                              router_tokenizer_path=str(tiny_tokenizer_dir))
    renderer = assemble(settings).router._context.renderer
    assert renderer is not None
    assert renderer.plain_recipes["default"].learnt == learnt
