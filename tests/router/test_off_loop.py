"""Large prompts are tokenized (and the largest rendered) off the event loop, with the same tokens as on it;
the next turn of a long conversation, whose prefix the prompt cache holds, stays on the loop."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from infera.kv.hashing import ArrayIds
from infera.kv.tokenizer import PromptRenderer
from infera.router.context import RENDER_ON_LOOP_MESSAGES, RouteRequest
from infera.router.router import OFF_LOOP_BYTES, Router, RouterOptions
from tests.fakes import MODEL, FakeFleet, FakeTransport, chat_request, worker


class RecordingRenderer(PromptRenderer):
    """The byte-level renderer, noting the thread each chat prompt was tokenized (and rendered) in."""

    threads: list[int]
    renders: list[int]

    def encode_chat(self, text: str) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().encode_chat(text)

    def encode_chat_ids(self, text: str) -> Sequence[int]:
        self.threads.append(threading.get_ident())
        return super().encode_chat_ids(text)

    def encode_chat_within(self, text: str, most: int, listed: bool = True) -> Sequence[int] | None:  # type: ignore[override]
        ids = super().encode_chat_within(text, most, listed)
        if ids is not None:
            self.threads.append(threading.get_ident())
        return ids

    def render_chat(self, *args: Any, **kwargs: Any) -> str:
        self.renders.append(threading.get_ident())
        return super().render_chat(*args, **kwargs)


@pytest.fixture
def renderer() -> RecordingRenderer:
    base = PromptRenderer.byte_level()
    base.__class__ = RecordingRenderer
    assert isinstance(base, RecordingRenderer)
    base.threads = []
    base.renders = []
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
    assert type(placed.ctx.token_ids) is ArrayIds  # the prompt cache's array, encoded in the thread
    assert await router.tokens_off_loop("chat", large.payload, len(large.body)) == placed.ctx.token_ids
    assert renderer.threads[-1] == loop_thread  # the same prompt again: the prompt cache holds it whole
    assert all(w.in_flight == 0 for w in router.view.workers())


def conversation(turns: int, words: int) -> RouteRequest:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "rules " * 2000}]
    for t in range(turns):
        messages += [{"role": "user", "content": f"question {t} " + "word " * words},
                     {"role": "assistant", "content": f"answer {t} " + "text " * words}]
    messages.append({"role": "user", "content": f"question {turns}"})
    payload = {"model": MODEL, "messages": messages, "max_tokens": 8}
    return RouteRequest(kind="chat", path="/v1/chat/completions", body=orjson.dumps(payload), payload=payload,
                        model=MODEL, max_tokens=8)


async def test_the_next_turn_of_a_large_cached_conversation_is_tokenized_on_the_loop(
        renderer: RecordingRenderer) -> None:
    router = make(renderer)
    loop_thread = threading.get_ident()
    first, second = conversation(40, 400), conversation(41, 400)  # each turn adds ~4 kB, the whole ~130 kB
    assert len(first.body) > OFF_LOOP_BYTES and len(second.body) - len(first.body) < OFF_LOOP_BYTES
    (await router.place(first)).release()
    placed = await router.place(second)
    placed.release()
    assert renderer.threads == [renderer.threads[0], loop_thread] and renderer.threads[0] != loop_thread
    assert renderer.renders == [loop_thread, loop_thread]
    cache = renderer.prompt_cache
    assert cache is not None and cache.hits == 1
    fresh = PromptRenderer.byte_level()
    assert placed.ctx.token_ids == fresh.chat_token_ids(list(second.payload["messages"]))
    assert type(placed.ctx.token_ids) is ArrayIds


async def test_a_prompt_of_many_messages_is_rendered_in_a_worker_thread(renderer: RecordingRenderer) -> None:
    router = make(renderer)
    loop_thread = threading.get_ident()
    many = conversation(RENDER_ON_LOOP_MESSAGES // 2 + 1, 30)
    assert len(many.payload["messages"]) > RENDER_ON_LOOP_MESSAGES and len(many.body) > OFF_LOOP_BYTES
    ids = await router.tokens_off_loop("chat", many.payload, len(many.body))
    assert renderer.renders == [renderer.renders[0]] and renderer.renders[0] != loop_thread
    assert ids == PromptRenderer.byte_level().chat_token_ids(list(many.payload["messages"]))
