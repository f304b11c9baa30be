"""The mock's HTTP API, driven by the official ``openai`` SDK and plain HTTP, against a real process."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from mock_harness import MockProcess

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city"]}}}]


@pytest.fixture(scope="module")
def mock() -> Iterator[MockProcess]:
    proc = MockProcess(["--speedup-ratio", "200", "--max-model-len", "512", "--served-model-name", "mock-model"])
    yield proc
    proc.stop()


@pytest.fixture
def client(mock: MockProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=mock.url + "/v1", api_key="none", max_retries=0)


def test_completion_is_deterministic_and_exactly_max_tokens(client: openai.OpenAI) -> None:
    first = client.completions.create(model="mock-model", prompt="Tell me a story", max_tokens=7)
    again = client.completions.create(model="mock-model", prompt="Tell me a story", max_tokens=7)
    assert first.choices[0].text == again.choices[0].text != ""
    assert first.choices[0].finish_reason == "length"
    assert first.usage is not None and first.usage.completion_tokens == 7
    assert first.usage.prompt_tokens == len(b"Tell me a story")  # the byte-level tokenizer
    other = client.completions.create(model="mock-model", prompt="Something else entirely", max_tokens=7)
    assert other.choices[0].text != first.choices[0].text


def test_completion_stream_matches_non_stream(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="mock-model", prompt="stream me", max_tokens=12)
    chunks = list(client.completions.create(model="mock-model", prompt="stream me", max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


def test_chat_stream_and_non_stream(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    whole = client.chat.completions.create(model="mock-model", messages=messages, max_tokens=9)  # type: ignore[arg-type]
    msg = whole.choices[0].message
    assert msg.role == "assistant" and msg.content and whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 9
    chunks = list(client.chat.completions.create(model="mock-model", messages=messages, max_tokens=9,  # type: ignore[arg-type]
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens is not None


def test_stop_string_ends_the_text(client: openai.OpenAI) -> None:
    full = client.completions.create(model="mock-model", prompt="stop test", max_tokens=30).choices[0].text
    words = full.split(" ")
    stop = " " + words[len(words) // 2]
    cut = client.completions.create(model="mock-model", prompt="stop test", max_tokens=30, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[:full.index(stop)]
    assert cut.usage is not None and cut.usage.completion_tokens < 30
    streamed = client.completions.create(model="mock-model", prompt="stop test", max_tokens=30, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.choices[0].text


def test_tool_calls_whole_and_streamed(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "weather in Paris?"}]
    whole = client.chat.completions.create(model="mock-model", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str) and args["unit"] in ("C", "F")
    chunks = list(client.chat.completions.create(model="mock-model", messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                                 stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id == call.id and deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert "".join((d.function.arguments or "") for d in deltas if d.function) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    none = client.chat.completions.create(model="mock-model", messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                          tool_choice="none", max_tokens=3)
    assert none.choices[0].message.tool_calls in (None, []) and none.choices[0].finish_reason == "length"


def test_shared_prefix_gives_cached_tokens(client: openai.OpenAI) -> None:
    base = "A shared system preamble about routing engines. " * 4  # 196 bytes = 12 full blocks of 16
    first = client.completions.create(model="mock-model", prompt=base + "\nQ: one", max_tokens=2)
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = client.completions.create(model="mock-model", prompt=base + "\nQ: two", max_tokens=2)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens == (len(base + "\nQ: ") // 16) * 16


def test_info_endpoints(mock: MockProcess, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["mock-model"]
    with httpx.Client(base_url=mock.url) as http:
        tok = http.post("/tokenize", json={"prompt": "hi"}).json()
        assert tok["tokens"] == [104, 105] and tok["count"] == 2 and tok["max_model_len"] == 512
        chat_tok = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        assert chat_tok["count"] > 2
        assert http.get("/livez").status_code == 200
        metrics = http.get("/metrics").text
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                     "vllm:time_to_first_token_seconds_bucket"):
            assert name in metrics
        info = http.get("/get_model_info").json()
        assert info["is_generation"] is True
        server = http.get("/get_server_info").json()
        assert server["page_size"] == 16 and server["max_running_requests"] == 256
        record = http.get("/infera/worker").json()
        assert record["model"] == "mock-model" and record["role"] == "mixed" and record["engine"] == "mock"
        assert record["http_url"] == mock.url and record["kv_block_size"] == 16
        assert record["kv_events"]["endpoint"].startswith("tcp://127.0.0.1:")


def test_sglang_generate(mock: MockProcess) -> None:
    with httpx.Client(base_url=mock.url) as http:
        out = http.post("/generate", json={"text": "sglang style", "sampling_params": {"max_new_tokens": 6}}).json()
        assert len(out["output_ids"]) == 6 and out["meta_info"]["completion_tokens"] == 6
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
        with http.stream("POST", "/generate", json={"input_ids": [1, 2, 3], "stream": True,
                                                    "sampling_params": {"max_new_tokens": 5}}) as resp:
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert len(last["output_ids"]) == 5 and last["meta_info"]["finish_reason"]["type"] == "length"


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"model": "mock-model"}, 400, "prompt"),
    ("/v1/completions", {"model": "mock-model", "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"model": "mock-model", "prompt": "x" * 600}, 400, "max_tokens"),
    ("/v1/completions", {"model": "mock-model", "prompt": "hi", "max_tokens": 600}, 400, "max_tokens"),
    ("/v1/completions", {"model": "mock-model", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": "other-model", "prompt": "hi"}, 404, "model"),
    ("/v1/chat/completions", {"model": "mock-model"}, 400, "messages"),
    ("/v1/chat/completions", {"model": "mock-model", "messages": [{"content": "no role"}]}, 400, "messages"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400, "stream"),
    ("/generate", {"sampling_params": {}}, 400, "text"),
    ("/v1/nothing-here", {}, 404, None),
])
def test_bad_input_gets_openai_error_and_engine_keeps_serving(
        mock: MockProcess, path: str, body: object, status: int, param: str | None) -> None:
    with httpx.Client(base_url=mock.url) as http:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        resp = http.post(path, **kwargs)  # type: ignore[arg-type]
        assert resp.status_code == status, resp.text
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == status and err["param"] == param and err["message"]
        ok = http.post("/v1/completions", json={"model": "mock-model", "prompt": "still alive", "max_tokens": 2})
        assert ok.status_code == 200
    assert mock.alive


def test_sdk_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="mock-model", prompt="hi", max_tokens=100000)
