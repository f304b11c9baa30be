"""Context: a request as the router sees it, and its routing context (the prompt as tokens and hashes).

The prompt is rendered and tokenized exactly as the engine will (the chat template of
``--router-tokenizer-path``), through :class:`PromptRenderer`'s public methods only, and
only for policies that read tokens. Block hashes are computed lazily, once per block size
(:meth:`RoutingContext.hashes`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any, Literal

from infera.kv.tokenizer import PromptRenderer
from infera.router.base import RoutingContext

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_TOKENS = 256


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
        max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_OUTPUT_TOKENS
        token_ids = self.tokens(req) if self._tokenize else None
        prompt_tokens = len(token_ids) if token_ids is not None else max(1, len(req.body) // 4)
        return RoutingContext(model=req.model, token_ids=token_ids, prompt_tokens=prompt_tokens,
                              max_tokens=max_tokens)

    def estimate(self, req: RouteRequest) -> RoutingContext:
        """A context without tokens (the prompt's length guessed from the body): no rendering cost."""
        max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_OUTPUT_TOKENS
        return RoutingContext(model=req.model, token_ids=None, prompt_tokens=max(1, len(req.body) // 4),
                              max_tokens=max_tokens)

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
            kwargs = payload.get("chat_template_kwargs") or {}
            return renderer.chat_token_ids(list(payload["messages"]), tools=payload.get("tools"), **kwargs)
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
            prompt = prompt[0]
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        return renderer.encode(str(prompt), add_special_tokens=True)
