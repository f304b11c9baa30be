"""``POST /v1/cache/prewarm``: a one-way hint to pull a prompt's KV blocks into a worker's warm tier.

Body: ``model``, and either ``messages`` (chat, with optional ``tools`` and
``chat_template_kwargs``) or ``prompt`` (a string or token ids), rendered and tokenized exactly
as the router does for a real request (system-prompt nonces stripped too); optionally
``worker`` (an instance id; default: the worker the kv-aware policy would pick now) and
``priority`` (an int, higher first). The prompt's full blocks go to the kvd socket as one
:mod:`infera.protocols.kvd` line and the answer is 202 with the worker and the number of
blocks hinted: at most the worker's device capacity (``capacity.kv_blocks`` of its record),
since a longer hint would only evict its own leading blocks (and a multi-megabyte hint can
keep a daemon busy for seconds). 400: a bad body; 404: an unknown model or worker; 503: no kvd socket
configured, the socket unreachable, no tokenizer, or no worker. Nothing here touches the
inference path: a hint is sent by this endpoint only, with a short timeout.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from infera.kv.hashing import block_hashes
from infera.protocols.kvd import make_hint
from infera.protocols.openai import ValidationError, first_error, strip_system_nonces
from infera.router.router import Router
from infera.server.errors import openai_error
from infera.server.intake import IntakeError, take
from infera.server.responses import JsonResponse
from infera.transport.kvd import KvdClient, KvdUnavailable

MAX_PREWARM_BODY = 8 * 1024 * 1024


class PrewarmRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    worker: str | None = None
    priority: int = Field(default=0, ge=-1000, le=1000)


class PrewarmHandlers:
    def __init__(self, router: Router, kvd: KvdClient | None, strip_patterns: Sequence[str]) -> None:
        self.router = router
        self.kvd = kvd
        self.patterns = [re.compile(p) for p in strip_patterns if p]

    def routes(self) -> APIRouter:
        api = APIRouter()
        api.add_api_route("/v1/cache/prewarm", self.prewarm, methods=["POST"])
        return api

    async def prewarm(self, request: Request) -> JsonResponse:
        if self.kvd is None:
            return openai_error(503, "prewarm needs a KV daemon: start the server with --kvd-socket-path")
        try:
            intake = await take(request, MAX_PREWARM_BODY, PrewarmRequest, describe, self._strip)
        except IntakeError as exc:
            return openai_error(exc.status, str(exc), param=exc.param)
        req, payload = intake.parsed, intake.payload
        if (req.messages is None) == (req.prompt is None):
            return openai_error(400, "give exactly one of messages or prompt", param="messages")
        if req.messages is not None and not req.messages:
            return openai_error(400, "messages must not be empty", param="messages")
        router = self.router
        if not router.can_tokenize:
            return openai_error(503, "prewarm needs the router's tokenizer: start the server with "
                                     "--router-tokenizer-path")
        if not router.view.serves(req.model):
            return openai_error(404, f"The model '{req.model}' does not exist", "not_found_error", "model")
        try:
            tokens = await router.tokens_off_loop("chat" if req.messages is not None else "completion", payload,
                                                  len(intake.body))
        except Exception as exc:  # a template that rejects the conversation
            return openai_error(400, f"cannot render the prompt: {exc}", param="messages")
        if req.worker is not None:
            worker = router.view.worker(req.worker)
            if worker is None or worker.model != req.model:
                return openai_error(404, f"no worker {req.worker!r} serving {req.model!r} in the fleet",
                                    "not_found_error", "worker")
        else:
            picked = router.preview(req.model, tokens)  # what the policy would pick now; nothing recorded
            if picked is None:
                return openai_error(503, f"no worker serves model {req.model!r}")
            worker = picked
        size = worker.kv_block_size
        hashes = block_hashes(tokens, size)
        prompt_blocks, cap = len(hashes), worker.capacity.kv_blocks
        if cap and prompt_blocks > cap:  # more than the device holds would only evict the prompt's own head
            hashes = hashes[:cap]
        answer = {"object": "cache.prewarm", "worker": worker.instance_id, "model": req.model,
                  "prompt_tokens": len(tokens), "block_size": size, "blocks": len(hashes),
                  "prompt_blocks": prompt_blocks, "priority": req.priority}
        if hashes:
            hint = make_hint(worker.instance_id, req.model, size, hashes, tokens, req.priority)
            try:
                await self.kvd.send(hint)
            except KvdUnavailable as exc:
                return openai_error(503, str(exc))
        return JsonResponse(answer, status_code=202, headers={"x-infera-worker": worker.instance_id})

    def _strip(self, payload: dict[str, Any], parsed: Any) -> bool:
        """System-prompt nonces go as on the chat path; the hint carries tokens, so the body stays."""
        if isinstance(parsed, PrewarmRequest) and parsed.messages is not None:
            strip_system_nonces(payload, self.patterns)
        return False


def describe(exc: ValidationError, payload: dict[str, Any]) -> tuple[str, str | None]:
    return first_error(exc)
