"""``POST /v1/cache/prewarm``: a one-way hint to pull a prompt's KV blocks into a worker's warm tier.

Body: ``model``, and either ``messages`` (chat, with optional ``tools`` and
``chat_template_kwargs``) or ``prompt`` (a string or token ids), rendered and tokenized exactly
as the router does for a real request (system-prompt nonces stripped too); optionally
``worker`` (an instance id; default: the worker the kv-aware policy would pick now) and
``priority`` (an int, higher first). The prompt's full blocks go to the kvd socket as one
:mod:`infera.protocols.kvd` line and the answer is 202 with the worker and the number of
blocks hinted. 400: a bad body; 404: an unknown model or worker; 503: no kvd socket
configured, the socket unreachable, no tokenizer, or no worker. Nothing here touches the
inference path: a hint is sent by this endpoint only, with a short timeout.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from infera.kv.hashing import block_hashes
from infera.protocols.kvd import make_hint
from infera.protocols.openai import ValidationError, first_error, strip_system_nonces
from infera.protocols.worker import WorkerRecord
from infera.router.base import Candidate, RoutingContext
from infera.router.router import Router
from infera.server.errors import openai_error
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
        body = await request.body()
        if len(body) > MAX_PREWARM_BODY:
            return openai_error(413, f"request body exceeds {MAX_PREWARM_BODY} bytes")
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return openai_error(400, f"malformed JSON body: {exc}")
        if not isinstance(payload, dict):
            return openai_error(400, "the request body must be a JSON object")
        try:
            req = PrewarmRequest.model_validate(payload)
        except ValidationError as exc:
            message, param = first_error(exc)
            return openai_error(400, message, param=param)
        if (req.messages is None) == (req.prompt is None):
            return openai_error(400, "give exactly one of messages or prompt", param="messages")
        if req.messages is not None and not req.messages:
            return openai_error(400, "messages must not be empty", param="messages")
        renderer = self.router.renderer
        if renderer is None:
            return openai_error(503, "prewarm needs the router's tokenizer: start the server with "
                                     "--router-tokenizer-path")
        if req.model not in self.router.models():
            return openai_error(404, f"The model '{req.model}' does not exist", "not_found_error", "model")
        try:
            if req.messages is not None:
                strip_system_nonces(payload, self.patterns)  # as the chat path does before routing
                tokens = renderer.chat_token_ids(list(payload["messages"]), tools=req.tools,
                                                 **(req.chat_template_kwargs or {}))
            elif isinstance(req.prompt, str):
                tokens = renderer.encode(req.prompt, add_special_tokens=True)
            else:
                tokens = list(req.prompt or [])
        except Exception as exc:  # a template that rejects the conversation
            return openai_error(400, f"cannot render the prompt: {exc}", param="messages")
        if req.worker is not None:
            worker = self.router.fleet.workers().get(req.worker)
            if worker is None or worker.model != req.model:
                return openai_error(404, f"no worker {req.worker!r} serving {req.model!r} in the fleet",
                                    "not_found_error", "worker")
        else:
            picked = self._pick(req.model, tokens)
            if picked is None:
                return openai_error(503, f"no worker serves model {req.model!r}")
            worker = picked
        size = worker.kv_block_size
        hashes = block_hashes(tokens, size)
        answer = {"object": "cache.prewarm", "worker": worker.instance_id, "model": req.model,
                  "prompt_tokens": len(tokens), "block_size": size, "blocks": len(hashes),
                  "priority": req.priority}
        if hashes:
            hint = make_hint(worker.instance_id, req.model, size, hashes, tokens, req.priority)
            try:
                await self.kvd.send(hint)
            except KvdUnavailable as exc:
                return openai_error(503, str(exc))
        return JsonResponse(answer, status_code=202, headers={"x-infera-worker": worker.instance_id})

    def _pick(self, model: str, tokens: list[int]) -> WorkerRecord | None:
        """The worker a cache-aware policy would pick for this prompt now (a preview: nothing is
        recorded). Ties go to the least busy, then the emptiest cache, then the lowest id (the
        router breaks the last tie at random). Decode workers never prefill, so never warm.
        """
        router = self.router
        cooling = router.cooling_down()
        eligible = sorted((w for w in router.fleet.workers().values() if w.model == model and w.role != "decode"),
                          key=lambda w: w.instance_id)
        pool = [w for w in eligible if w.instance_id not in cooling] or eligible
        if not pool:
            return None
        load = router.load
        cands = [Candidate(w, load.in_flight(w.instance_id), load.prefill_tokens(w.instance_id),
                           load.active_blocks(w.instance_id)) for w in pool]
        if router.policy.needs_tokens:
            ctx = RoutingContext(model=model, token_ids=tokens, prompt_tokens=len(tokens), max_tokens=1)
            costs = router.policy.score(ctx, cands).costs
        else:  # a cache-blind policy (and maybe a stateful one, like a rotation): do not consult it
            costs = [0.0] * len(cands)
        best = min(range(len(pool)), key=lambda i: (costs[i], cands[i].in_flight,
                                                     router.index.block_count(pool[i].instance_id)))
        return pool[best]
