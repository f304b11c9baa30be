"""What every HTTP endpoint shares: request validation, tokenization, output planning, submission.

Pure of HTTP objects: handlers pass the parsed JSON body in and get token ids, a planned
output, or an :class:`ApiError` (OpenAI-shaped, with the status to send) back.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from infera.config.engine import MockEngineSettings
from infera.engine.mock.engine import Engine, RequestHandle
from infera.engine.mock.role import Role
from infera.engine.mock.text import OutputVocab, PlannedOutput, stop_list
from infera.engine.mock.tools import plan_tool_call, wants_tool_call
from infera.kv.tokenizer import ChatTemplateError, PromptRenderer
from infera.protocols.worker import WorkerRecord

COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed"}.get(self.status, "ServerError")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{name} must be an integer", param=name)
    return value


class MockService:
    def __init__(self, settings: MockEngineSettings, renderer: PromptRenderer, engine: Engine, role: Role,
                 record: WorkerRecord) -> None:
        self.settings = settings
        self.renderer = renderer
        self.vocab = OutputVocab(renderer.encode, renderer.decode)
        self.engine = engine
        self.role = role
        self.record = record
        self.model = settings.served_model_name
        self.created = int(time.time())
        self._ids = itertools.count()
        self._id_prefix = os.urandom(4).hex()

    def request_id(self, prefix: str) -> str:
        return f"{prefix}-{self._id_prefix}{next(self._ids):08x}"

    def check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model:
            raise ApiError(f"The model `{model}` does not exist.", status=404, param="model")

    # -- prompts ---------------------------------------------------------------------------

    def text_prompt(self, body: dict[str, Any], field: str = "prompt") -> list[int]:
        """Token ids of a completion-style prompt: a string, token ids, or a one-element list of either."""
        prompt = body.get(field)
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            add_special = body.get("add_special_tokens", True) is not False
            ids = self.renderer.encode(prompt, add_special_tokens=add_special)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in prompt):
            ids = list(prompt)
        elif prompt is None:
            raise ApiError(f"{field} is required", param=field)
        else:
            raise ApiError(f"{field} must be a string or a list of token ids (one prompt per request)", param=field)
        if not ids:
            raise ApiError("the prompt is empty", param=field)
        return ids

    def chat_prompt(self, body: dict[str, Any], messages: Any = None) -> list[int]:
        messages = body.get("messages") if messages is None else messages
        if not isinstance(messages, list) or not messages:
            raise ApiError("messages is required: a non-empty list", param="messages")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError("every message needs a string role", param="messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ApiError("tools must be a list", param="tools")
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ApiError("chat_template_kwargs must be an object", param="chat_template_kwargs")
        try:
            return self.renderer.chat_token_ids(messages, tools=tools or None,
                                                add_generation_prompt=body.get("add_generation_prompt", True),
                                                **kwargs)
        except (ChatTemplateError, KeyError, TypeError, ValueError) as exc:
            raise ApiError(f"cannot render the chat prompt: {exc}", param="messages") from exc

    # -- outputs ---------------------------------------------------------------------------

    def max_tokens(self, body: dict[str, Any], prompt_len: int, *, chat: bool, name: str = "max_tokens") -> int:
        limit = self.settings.max_model_len
        value = _int_field(body, "max_completion_tokens", None) if chat else None
        if value is None:
            room = min(limit, self.engine.pool.num_usable * self.engine.pool.block_size) - prompt_len
            default = max(1, room) if chat else COMPLETION_DEFAULT_MAX_TOKENS
            value = _int_field(body, name, default)
        assert value is not None
        if value < 1:
            raise ApiError(f"{name} must be at least 1, got {value}", param=name)
        if prompt_len + value > limit:
            raise ApiError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + value} tokens ({prompt_len} in the prompt, {value} in the completion). "
                "Please reduce the length of the prompt or completion.", param=name)
        return value

    def plan(self, body: dict[str, Any], prompt_ids: list[int], max_tokens: int, *, chat: bool,
             stop: Any = None) -> PlannedOutput:
        try:
            stops = stop_list(body.get("stop") if stop is None else stop)
        except ValueError as exc:
            raise ApiError(str(exc), param="stop") from exc
        seed = self.settings.seed
        if chat and wants_tool_call(body.get("tools"), body.get("tool_choice")):
            rng = self.vocab.rng_for(prompt_ids, seed)
            try:
                output = plan_tool_call(body["tools"], body.get("tool_choice"), rng, self.renderer.encode)
            except (AttributeError, TypeError, ValueError) as exc:
                raise ApiError(f"bad tools: {exc}", param="tools") from exc
        else:
            output = self.vocab.plan(prompt_ids, max_tokens, stops, seed)
        return self.role.admit(body, prompt_ids, output)

    def submit(self, prompt_ids: list[int], output: PlannedOutput, *, stream: bool, request_id: str,
               body: dict[str, Any] | None = None, transferred: int = 0) -> RequestHandle:
        """Queue a request; ``transferred`` prompt tokens came from a prefill worker (see ``Role.receive_kv``)."""
        total = len(prompt_ids) + len(output.ids)
        if not self.engine.fits(total):
            raise ApiError(f"the request needs {self.engine.blocks_needed(total)} KV blocks; the cache has "
                           f"{self.engine.pool.num_usable}")
        handle = self.engine.submit(request_id, prompt_ids, output, stream=stream, transferred=transferred)
        if body is not None:
            self.role.submitted(body, handle)
        return handle

    def usage(self, handle: RequestHandle) -> dict[str, Any]:
        seq = handle.seq
        return {
            "prompt_tokens": seq.prompt_len,
            "total_tokens": seq.prompt_len + seq.num_emitted,
            "completion_tokens": seq.num_emitted,
            "prompt_tokens_details": {"cached_tokens": max(0, seq.cached_tokens)},
        }
