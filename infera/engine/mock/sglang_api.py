"""SGLang's native endpoints: ``/generate``, ``/get_model_info``, ``/get_server_info``.

So that SGLang's own router can drive the mock in side-by-side benchmarks. ``/generate``
streams SGLang-style: every event carries the text so far (not a delta).
"""

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

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128


class SglangEndpoints:
    def __init__(self, service: MockService) -> None:
        self.s = service

    async def generate(self, request: Request) -> Response:
        s = self.s
        body = await json_body(request)
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise ApiError("sampling_params must be an object", param="sampling_params")
        if body.get("input_ids") is not None:
            prompt_ids = s.text_prompt(body, "input_ids")
        elif body.get("text") is not None:
            prompt_ids = s.text_prompt(body, "text")
        else:
            raise ApiError("text or input_ids is required", param="text")
        budget = {"max_tokens": params.get("max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS)}
        max_tokens = s.max_tokens(budget, len(prompt_ids), chat=False)
        output = s.plan(body, prompt_ids, max_tokens, chat=False, stop=params.get("stop") or [])
        rid = str(body.get("rid") or s.request_id("sgl"))
        stream = bool_field(body, "stream")
        handle = s.submit(prompt_ids, output, stream=stream, request_id=rid)
        started = time.monotonic()
        if stream:
            return SseResponse(self._stream(handle, rid, started), lambda: s.engine.abort(handle))
        if not await finished_or_disconnected(handle.done, request.receive, lambda: s.engine.abort(handle)):
            return Response(status_code=499)
        return json_response(self._result(handle, rid, started, handle.seq.num_emitted))

    def _result(self, handle: RequestHandle, rid: str, started: float, upto: int) -> dict[str, Any]:
        seq, output = handle.seq, handle.output
        finish: dict[str, Any] | None = None
        if seq.finished and upto >= seq.num_emitted:
            finish = ({"type": "stop", "matched": output.stop_reason} if output.finish_reason == "stop"
                      else {"type": "length", "length": len(output.ids)})
        return {
            "text": "".join(output.pieces[:upto]),
            "output_ids": output.ids[:upto],
            "meta_info": {
                "id": rid, "finish_reason": finish, "prompt_tokens": seq.prompt_len,
                "completion_tokens": upto, "cached_tokens": max(0, seq.cached_tokens),
                "e2e_latency": time.monotonic() - started,
            },
        }

    async def _stream(self, handle: RequestHandle, rid: str, started: float) -> AsyncIterator[bytes]:
        try:
            finished = False
            while not finished:
                _start, end, finished = await handle.wait_tokens()
                chunk = sse(self._result(handle, rid, started, end))
                yield chunk + DONE if finished else chunk
        finally:
            self.s.engine.abort(handle)

    async def model_info(self, request: Request) -> Response:
        s = self.s
        path = s.settings.model_path or s.model
        return json_response({"model_path": path, "tokenizer_path": path, "is_generation": True,
                              "preferred_sampling_params": None, "weight_version": "default",
                              "has_image_understanding": False, "has_audio_understanding": False})

    async def server_info(self, request: Request) -> Response:
        s = self.s
        st = s.settings
        pool = s.engine.pool
        return json_response({
            "model_path": st.model_path or s.model, "served_model_name": s.model, "page_size": st.block_size,
            "max_running_requests": st.max_num_seqs, "max_total_num_tokens": pool.num_usable * st.block_size,
            "chunked_prefill_size": st.max_num_batched_tokens, "context_length": st.max_model_len,
            "disaggregation_mode": "null" if st.role == "mixed" else st.role, "version": "infera-mock",
            "internal_states": [{"num_running_reqs": len(s.engine.scheduler.running),
                                 "num_waiting_reqs": len(s.engine.scheduler.waiting),
                                 "token_usage": pool.usage}],
        })
