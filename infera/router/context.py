"""Context: a request as the router sees it, and its routing context (the prompt as tokens and hashes).

The prompt is rendered and tokenized exactly as the engine will (the chat template of
``--router-tokenizer-path``), through :class:`PromptRenderer`'s public methods only, and
only for policies that read tokens. Block hashes are computed lazily, once per block size
(:meth:`RoutingContext.hashes`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

from infera.kv.hashing import ArrayIds, PromptIds
from infera.kv.tokenizer import PromptRenderer
from infera.router.base import RoutingContext

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_TOKENS = 256
# A large chat prompt's template is rendered on the event loop up to these sizes (~1-3 ms of Jinja at
# either bound, bench/README.md "Issue 15, fourth round"); a larger one is rendered in a worker thread.
RENDER_ON_LOOP_BYTES = 256 * 1024
RENDER_ON_LOOP_MESSAGES = 512


@dataclasses.dataclass(slots=True)
class RouteRequest:
    kind: Literal["chat", "completion"]
    path: str  # the engine path to forward to, e.g. /v1/chat/completions
    body: bytes  # forwarded as is
    payload: Mapping[str, Any]  # the parsed body (read for tokenization only)
    model: str
    max_tokens: int | None = None
    worker_hint: str | None = None  # x-worker-instance-id (direct mode; the decode worker of a pair)
    prefill_hint: str | None = None  # x-prefill-instance-id (direct mode; the prefill worker of a pair)
    # time.monotonic() at intake: a transport's whole-request cap counts from here, across retries
    started: float = dataclasses.field(default_factory=time.monotonic)


class ContextBuilder:
    """``renderer`` None, or ``tokenize`` False: contexts carry an estimate of the prompt's length only."""

    def __init__(self, renderer: PromptRenderer | None, tokenize: bool) -> None:
        self.renderer = renderer
        self._tokenize = tokenize and renderer is not None

    @property
    def tokenizes(self) -> bool:
        """True when :meth:`build` renders and tokenizes the prompt (else it only estimates its length)."""
        return self._tokenize

    def build(self, req: RouteRequest) -> RoutingContext:
        if not self._tokenize:
            return self._context(req, None)
        try:
            # a chat prompt's ids as the prompt cache holds them (ArrayIds: counted and hashed, no list built)
            token_ids = self._prompt_ids(req.kind, req.payload)
        except Exception as exc:
            log.debug("could not render the prompt for routing: %s", exc)
            token_ids = None
        return self._context(req, token_ids)

    def estimate(self, req: RouteRequest) -> RoutingContext:
        """A context without tokens (the prompt's length guessed from the body): no rendering cost."""
        return self._context(req, None)

    async def build_off_loop(self, req: RouteRequest, off_loop: int) -> RoutingContext:
        """:meth:`build` for a body over ``off_loop`` bytes, without long work on the event loop: see
        :meth:`prompt_tokens_off_loop`."""
        try:
            token_ids = await self.prompt_tokens_off_loop(req.kind, req.payload, len(req.body), off_loop, listed=False)
        except Exception as exc:
            log.debug("could not render the prompt for routing: %s", exc)
            return self._context(req, None)
        return self._context(req, token_ids)

    @staticmethod
    def _context(req: RouteRequest, token_ids: Sequence[int] | None) -> RoutingContext:
        """The request's context: its prompt's length from ``token_ids``, else guessed from the body."""
        max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_OUTPUT_TOKENS
        prompt_tokens = len(token_ids) if token_ids is not None else max(1, len(req.body) // 4)
        # the prompt cache's block hashes of these very ids (nothing has touched the list since): ctx.hashes() need not
        # compare the list with the cache's copy first
        known = token_ids.complete if type(token_ids) is PromptIds or type(token_ids) is ArrayIds else None
        return RoutingContext(model=req.model, token_ids=token_ids, prompt_tokens=prompt_tokens,
                              max_tokens=max_tokens, _hashes=dict(known) if known else {})

    @overload
    async def prompt_tokens_off_loop(self, kind: Literal["chat", "completion"], payload: Mapping[str, Any],
                                     size: int, off_loop: int) -> list[int]: ...

    @overload
    async def prompt_tokens_off_loop(self, kind: Literal["chat", "completion"], payload: Mapping[str, Any],
                                     size: int, off_loop: int, listed: bool) -> Sequence[int]: ...

    async def prompt_tokens_off_loop(self, kind: Literal["chat", "completion"], payload: Mapping[str, Any],
                                     size: int, off_loop: int, listed: bool = True) -> Sequence[int]:
        """:meth:`prompt_tokens` of a body of ``size`` bytes, the expensive part in a worker thread.

        Up to ``off_loop`` bytes all of it runs here. Above, a chat prompt of at most
        ``RENDER_ON_LOOP_BYTES`` and ``RENDER_ON_LOOP_MESSAGES`` is rendered here, and only its
        tokenization goes to a thread, and only when the prompt cache lacks over ``off_loop`` bytes
        of it: the next turn of a long conversation costs ~0.1-2 ms here, less than the thread hop
        adds (waking the thread, the GIL passed back and forth at every tokenizer call). Anything
        else (a completion prompt, a bigger chat) goes to the thread whole. ``listed`` False: a chat
        prompt's ids perhaps as an ``ArrayIds`` (see :meth:`PromptRenderer.encode_chat_ids`).
        """
        renderer = self.renderer
        whole = self.prompt_tokens if listed else self._prompt_ids
        if size <= off_loop or renderer is None:
            return whole(kind, payload)
        messages = payload.get("messages") if kind == "chat" else None
        if (not isinstance(messages, list) or len(messages) > RENDER_ON_LOOP_MESSAGES
                or size > RENDER_ON_LOOP_BYTES):
            return await asyncio.to_thread(whole, kind, payload)
        text = self._chat_text(renderer, payload)
        ids = renderer.encode_chat_within(text, off_loop, listed)
        if ids is not None:
            return ids
        return await asyncio.to_thread(renderer.encode_chat if listed else renderer.encode_chat_ids, text)

    def tokens(self, req: RouteRequest) -> list[int] | None:
        """The prompt's token ids, or None when the template rejects it (the engine will say why)."""
        try:
            return self.prompt_tokens(req.kind, req.payload)
        except Exception as exc:
            log.debug("could not render the prompt for routing: %s", exc)
            return None

    def prompt_tokens(self, kind: Literal["chat", "completion"], payload: Mapping[str, Any]) -> list[int]:
        """The prompt's token ids as the engine will see them; raises what the renderer raises.

        Chat: ``messages`` (and ``tools``, ``chat_template_kwargs``) through the chat template.
        Completion: ``prompt`` as token ids or encoded text; a batch is routed by its first prompt.
        """
        renderer = self.renderer
        if renderer is None:
            raise LookupError("no tokenizer (--router-tokenizer-path)")
        if kind == "chat":
            return renderer.encode_chat(self._chat_text(renderer, payload))
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            prompt = prompt[0]
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        return renderer.encode(str(prompt), add_special_tokens=True)

    def _prompt_ids(self, kind: Literal["chat", "completion"], payload: Mapping[str, Any]) -> Sequence[int]:
        """:meth:`prompt_tokens`, a chat prompt's ids as :meth:`PromptRenderer.encode_chat_ids` gives them."""
        renderer = self.renderer
        if kind == "chat" and renderer is not None:
            return renderer.encode_chat_ids(self._chat_text(renderer, payload))
        return self.prompt_tokens(kind, payload)

    @staticmethod
    def _chat_text(renderer: PromptRenderer, payload: Mapping[str, Any]) -> str:
        """The chat prompt's text: ``messages`` (and ``tools``, ``chat_template_kwargs``) through the template."""
        kwargs = payload.get("chat_template_kwargs") or {}
        return renderer.render_chat(list(payload["messages"]), tools=payload.get("tools"), **kwargs)
