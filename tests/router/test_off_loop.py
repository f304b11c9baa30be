"""Large prompts are rendered and tokenized off the event loop, with the same tokens as on it."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from infera.kv.tokenizer import PromptRenderer
from infera.router.router import OFF_LOOP_BYTES, Router, RouterOptions
from tests.fakes import FakeFleet, FakeTransport, chat_request, worker


class RecordingRenderer(PromptRenderer):
    """The byte-level renderer, noting the thread each chat prompt was tokenized in."""

    threads: list[int]

    def chat_token_ids(self, *args: Any, **kwargs: Any) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().chat_token_ids(*args, **kwargs)


@pytest.fixture
def renderer() -> RecordingRenderer:
    base = PromptRenderer.byte_level()
    base.__class__ = RecordingRenderer
    assert isinstance(base, RecordingRenderer)
    base.threads = []
    return base


def make(renderer: PromptRenderer) -> Router:
    return Router(FakeFleet(worker("a"), worker("b")), FakeTransport(), None, renderer,
                  RouterOptions(policy="kv-aware"), rng=random.Random(7))


async def test_a_large_prompt_is_tokenized_in_a_worker_thread_with_the_same_tokens(
        renderer: RecordingRenderer) -> None:
    router = make(renderer)
    loop_thread = threading.get_ident()
    small, large = chat_request("hi " * 100), chat_request("a much longer prompt " * (OFF_LOOP_BYTES // 10))
    assert len(small.body) < OFF_LOOP_BYTES < len(large.body)
    (await router.place(small)).release()
    placed = await router.place(large)
    placed.release()
    assert renderer.threads[0] == loop_thread and renderer.threads[1] != loop_thread
    assert placed.ctx.token_ids == router.tokens("chat", large.payload)  # exactness unchanged
    assert await router.tokens_off_loop("chat", large.payload, len(large.body)) == placed.ctx.token_ids
    assert renderer.threads[-1] != loop_thread
    assert all(w.in_flight == 0 for w in router.view.workers())
