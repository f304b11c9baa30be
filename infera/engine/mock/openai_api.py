"""OpenAI-compatible endpoints, shaped like vLLM's: ``/v1/completions`` and ``/v1/chat/completions``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from infera.engine.mock.engine import RequestHandle
from infera.engine.mock.responses import (
    DONE,
    SseResponse,
    bool_field,
    finished_or_disconnected,
    json_body,
    json_response,
    sse,
)
from infera.engine.mock.service import ApiError, MockService


def _include_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise ApiError("stream_options must be an object", param="stream_options")
    return bool(opts.get("include_usage"))


class OpenAiEndpoints:
    def __init__(self, service: MockService) -> None:
        self.s = service

    # -- /v1/completions -------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        s = self.s
        body = await json_body(request)
        s.check_model(body)
        stream = bool_field(body, "stream")
        include_usage = _include_usage(body)
        prompt_ids = s.text_prompt(body)
        output = s.plan(body, prompt_ids, s.max_tokens(body, len(prompt_ids), chat=False), chat=False)
        rid = s.request_id("cmpl")
        transferred = await s.role.receive_kv(body, prompt_ids)
        handle = s.submit(prompt_ids, output, stream=stream, request_id=rid, body=body, transferred=transferred)
        created = int(time.time())
        if stream:
            chunks = self._stream_completion(handle, rid, created, include_usage)
            return SseResponse(chunks, lambda: s.engine.abort(handle))
        if not await finished_or_disconnected(handle.done, request.receive, lambda: s.engine.abort(handle)):
            return Response(status_code=499)
        choice: dict[str, Any] = {"index": 0, "text": output.text, "logprobs": None,
                                  "finish_reason": output.finish_reason, "stop_reason": output.stop_reason}
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = output.ids
        return json_response({"id": rid, "object": "text_completion", "created": created, "model": s.model,
                              "choices": [choice], "usage": s.usage(handle), **s.role.response_extras(body, handle)})

    async def _stream_completion(self, handle: RequestHandle, rid: str, created: int,
                                 include_usage: bool) -> AsyncIterator[bytes]:
        s = self.s
        pieces = handle.output.pieces
        head = {"id": rid, "object": "text_completion", "created": created, "model": s.model}
        try:
            finished = False
            while not finished:
                start, end, finished = await handle.wait_tokens()
                choice: dict[str, Any] = {"index": 0, "text": "".join(pieces[start:end]), "logprobs": None,
                                          "finish_reason": None, "stop_reason": None}
                if finished:
                    choice["finish_reason"] = handle.output.finish_reason
                    choice["stop_reason"] = handle.output.stop_reason
                chunk = sse({**head, "choices": [choice]})
                if finished:
                    if include_usage:
                        chunk += sse({**head, "choices": [], "usage": s.usage(handle)})
                    chunk += DONE
                yield chunk
        finally:
            s.engine.abort(handle)

    # -- /v1/chat/completions --------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        s = self.s
        body = await json_body(request)
        s.check_model(body)
        stream = bool_field(body, "stream")
        include_usage = _include_usage(body)
        prompt_ids = s.chat_prompt(body)
        output = s.plan(body, prompt_ids, s.max_tokens(body, len(prompt_ids), chat=True), chat=True)
        rid = s.request_id("chatcmpl")
        transferred = await s.role.receive_kv(body, prompt_ids)
        handle = s.submit(prompt_ids, output, stream=stream, request_id=rid, body=body, transferred=transferred)
        created = int(time.time())
        if stream:
            return SseResponse(self._stream_chat(handle, rid, created, include_usage), lambda: s.engine.abort(handle))
        if not await finished_or_disconnected(handle.done, request.receive, lambda: s.engine.abort(handle)):
            return Response(status_code=499)
        message: dict[str, Any] = {"role": "assistant", "content": output.text, "tool_calls": []}
        call = output.tool_call
        if call is not None:
            message["content"] = None
            message["tool_calls"] = [{"id": call.id, "type": "function",
                                      "function": {"name": call.name, "arguments": call.arguments}}]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": output.finish_reason,
                  "stop_reason": output.stop_reason}
        return json_response({"id": rid, "object": "chat.completion", "created": created, "model": s.model,
                              "choices": [choice], "usage": s.usage(handle), **s.role.response_extras(body, handle)})

    async def _stream_chat(self, handle: RequestHandle, rid: str, created: int,
                           include_usage: bool) -> AsyncIterator[bytes]:
        s = self.s
        output = handle.output
        pieces = output.pieces
        call = output.tool_call
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": s.model}
        try:
            first: dict[str, Any] = {"role": "assistant", "content": ""}
            if call is not None:
                first = {"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": call.id, "type": "function",
                     "function": {"name": call.name, "arguments": ""}}]}
            # The role chunk goes out with the first token (one write; clients see the same events).
            pending = sse({**head, "choices": [{"index": 0, "delta": first, "logprobs": None, "finish_reason": None}]})
            finished = False
            while not finished:
                start, end, finished = await handle.wait_tokens()
                text = "".join(pieces[start:end])
                delta: dict[str, Any] = {"content": text}
                if call is not None:
                    delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                if finished:
                    choice["finish_reason"] = output.finish_reason
                    choice["stop_reason"] = output.stop_reason
                chunk = pending + sse({**head, "choices": [choice]})
                pending = b""
                if finished:
                    if include_usage:
                        chunk += sse({**head, "choices": [], "usage": s.usage(handle)})
                    chunk += DONE
                yield chunk
        finally:
            s.engine.abort(handle)
