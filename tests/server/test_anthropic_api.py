"""The Anthropic Messages API through the official anthropic SDK, against real mock-engine processes."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import Message, MessageParam, ToolParam

from harness import metric, scrape
from tests.server.conftest import MODEL, Fleet

WEATHER: ToolParam = {
    "name": "get_weather", "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city"]},
}
CLOCK: ToolParam = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}


def client(fleet: Fleet) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fleet.frontend.url, api_key="sk-ant-unused", max_retries=0, timeout=60)


def post(fleet: Fleet, body: Any, path: str = "/v1/messages") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(fleet.frontend.url + path, content=content, timeout=60,
                      headers={"content-type": "application/json", "anthropic-version": "2023-06-01",
                               "x-api-key": "sk-ant-unused"})


def text_of(message: Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def assert_same_message(streamed: Message, whole: Message) -> None:
    """Equal but for the id and how the prompt splits into cached and uncached tokens."""
    assert streamed.model_dump(exclude={"id", "usage"}) == whole.model_dump(exclude={"id", "usage"})
    s, w = streamed.usage, whole.usage
    assert s.output_tokens == w.output_tokens
    assert s.input_tokens + (s.cache_read_input_tokens or 0) == w.input_tokens + (w.cache_read_input_tokens or 0)


def test_plain_text(fleet: Fleet) -> None:
    raw = client(fleet).messages.with_raw_response.create(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Say something."}])
    assert raw.headers["x-infera-worker"]
    reply = raw.parse()
    assert reply.type == "message" and reply.role == "assistant" and reply.model == MODEL
    assert reply.id.startswith("msg_")
    assert [b.type for b in reply.content] == ["text"] and text_of(reply).strip()
    assert reply.stop_reason == "max_tokens" and reply.stop_sequence is None
    assert reply.usage.output_tokens == 12
    assert reply.usage.input_tokens > 0 and reply.usage.cache_creation_input_tokens == 0


def test_system_blocks_render_like_a_joined_system_string(fleet: Fleet) -> None:
    c = client(fleet)
    user: list[MessageParam] = [{"role": "user", "content": "Who are you?"}]
    joined = c.messages.create(model=MODEL, max_tokens=10, system="You are terse.\nYou like rivers.",
                               messages=user)
    blocks = c.messages.create(model=MODEL, max_tokens=10, messages=user,
                               system=[{"type": "text", "text": "You are terse."},
                                       {"type": "text", "text": "You like rivers.",
                                        "cache_control": {"type": "ephemeral"}}])
    plain = c.messages.create(model=MODEL, max_tokens=10, messages=user)
    assert text_of(joined) == text_of(blocks)  # the mock's output is seeded by the prompt's token ids
    assert text_of(plain) != text_of(joined)


def test_multi_turn(fleet: Fleet) -> None:
    c = client(fleet)
    first = c.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Tell me a word."}])
    history: list[MessageParam] = [
        {"role": "user", "content": "Tell me a word."},
        {"role": "assistant", "content": text_of(first)},
        {"role": "user", "content": [{"type": "text", "text": "Another one."}, {"type": "text", "text": "Please."}]},
    ]
    second = c.messages.create(model=MODEL, max_tokens=8, messages=history)
    assert text_of(second) and text_of(second) != text_of(first)
    assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) > \
        first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)


def test_tool_use_round_trip(fleet: Fleet) -> None:
    c = client(fleet)
    question: MessageParam = {"role": "user", "content": "What is the weather in Paris?"}
    call = c.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER], messages=[question])
    assert call.stop_reason == "tool_use"
    uses = [b for b in call.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    assert isinstance(uses[0].input, dict) and isinstance(uses[0].input["city"], str)
    assert uses[0].input["unit"] in ("celsius", "fahrenheit")
    answer = c.messages.create(model=MODEL, max_tokens=16, tools=[WEATHER], tool_choice={"type": "none"}, messages=[
        question,
        {"role": "assistant", "content": call.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": [{"type": "text", "text": "18 C, sunny"}]}]},
    ])
    assert [b.type for b in answer.content] == ["text"] and text_of(answer)
    assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == 16
    errored = c.messages.create(model=MODEL, max_tokens=16, tools=[WEATHER], tool_choice={"type": "none"}, messages=[
        question,
        {"role": "assistant", "content": call.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 C, sunny",
                                      "is_error": True}]},
    ])
    assert text_of(errored) != text_of(answer)  # is_error reaches the prompt


def test_tool_choice_names_the_tool(fleet: Fleet) -> None:
    c = client(fleet)
    for name in ("get_time", "get_weather"):
        reply = c.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER, CLOCK],
                                  tool_choice={"type": "tool", "name": name},
                                  messages=[{"role": "user", "content": "Use a tool."}])
        assert [b.name for b in reply.content if b.type == "tool_use"] == [name]


@pytest.mark.parametrize("tools", [False, True])
def test_streamed_final_message_equals_the_whole_one(fleet: Fleet, tools: bool) -> None:
    c = client(fleet)
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 20,
                              "messages": [{"role": "user", "content": f"Stream and compare ({tools})."}]}
    if tools:
        kwargs["tools"] = [WEATHER]
    whole = c.messages.create(**kwargs)
    with c.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    assert_same_message(streamed, whole)
    assert streamed.stop_reason == ("tool_use" if tools else "max_tokens")


def sse_events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


@pytest.mark.parametrize("tools", [False, True])
def test_stream_is_exactly_anthropics_event_sequence(fleet: Fleet, tools: bool) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 12, "stream": True,
                            "messages": [{"role": "user", "content": "Exact events please."}]}
    if tools:
        body["tools"] = [WEATHER]
    response = post(fleet, body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in response.text
    events = sse_events(response)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert names[0] == "message_start" and names.count("message_start") == 1
    assert names[-2:] == ["message_delta", "message_stop"]
    blocks = [n for n in names if n not in ("ping", "message_start", "message_delta", "message_stop")]
    assert blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop"
    assert blocks.count("content_block_start") == blocks.count("content_block_stop") == 1
    start = next(d for n, d in events if n == "content_block_start")["content_block"]
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    if tools:
        assert start["type"] == "tool_use" and start["name"] == "get_weather" and start["input"] == {}
        assert {d["type"] for d in deltas} == {"input_json_delta"}
        assert isinstance(json.loads("".join(d["partial_json"] for d in deltas)), dict)
    else:
        assert start == {"type": "text", "text": ""}
        assert {d["type"] for d in deltas} == {"text_delta"} and "".join(d["text"] for d in deltas)
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == ("tool_use" if tools else "max_tokens")
    assert final["usage"]["input_tokens"] + final["usage"]["cache_read_input_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences(fleet: Fleet, stream: bool) -> None:
    c = client(fleet)
    messages: list[MessageParam] = [{"role": "user", "content": "Words until a stop."}]
    full = text_of(c.messages.create(model=MODEL, max_tokens=30, messages=messages))
    stop = " " + full.split()[5]
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 30, "messages": messages,
                              "stop_sequences": ["never-appears", stop]}
    if stream:
        with c.messages.stream(**kwargs) as s:
            reply = s.get_final_message()
    else:
        reply = c.messages.create(**kwargs)
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    assert text_of(reply) == full[:full.find(stop)]


def test_max_tokens(fleet: Fleet) -> None:
    reply = client(fleet).messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3


UNSUPPORTED: list[tuple[str, dict[str, Any]]] = [
    ("image", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}),
    ("document", {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello"}}]}]}),
    ("search_result", {"messages": [{"role": "user", "content": [
        {"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": "x"}]}]}]}),
    ("image", {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}],
        "tools": [CLOCK]}),
    ("thinking", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"}]}]}),
    ("redacted_thinking", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "abc"}]}]}),
    ("server_tool_use", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}}]}]}),
    ("web_search_tool_result", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}]}]}),
    ("thinking", {"messages": [{"role": "user", "content": "x"}],
                  "thinking": {"type": "enabled", "budget_tokens": 2048}}),
    ("web_search_20250305", {"messages": [{"role": "user", "content": "x"}],
                             "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
    ("bash_20250124", {"messages": [{"role": "user", "content": "x"}],
                       "tools": [{"type": "bash_20250124", "name": "bash"}]}),
]


@pytest.mark.parametrize(("kind", "body"), UNSUPPORTED, ids=[f"{k}-{i}" for i, (k, _) in enumerate(UNSUPPORTED)])
def test_unsupported_content_is_a_400_naming_it(fleet: Fleet, kind: str, body: dict[str, Any]) -> None:
    with pytest.raises(anthropic.BadRequestError) as exc:
        client(fleet).messages.create(model=MODEL, max_tokens=8, **body)
    assert exc.value.status_code == 400
    error = exc.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and f"'{kind}'" in error["message"]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"{not json", "malformed JSON"),
        (b"[1, 2]", "JSON object"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 5}, "messages"),
        ({"model": MODEL, "max_tokens": 5, "messages": []}, "messages"),
        ({"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]},
         "temperature"),
        ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "frobnicate": 1},
         "frobnicate"),
        ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
         "messages.0.content.0.text"),
        ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "y"}]}]}, "tool_use_id"),
        ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ],
)
def test_malformed_bodies(fleet: Fleet, body: Any, where: str) -> None:
    response = post(fleet, body)
    assert response.status_code == 400, response.text
    data = response.json()
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    assert where in data["error"]["message"]


def test_body_over_the_limit_is_413(fleet: Fleet) -> None:
    huge = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x" * (8 * 1024 * 1024)}]}
    response = post(fleet, huge)
    assert response.status_code == 413 and response.json()["error"]["type"] == "request_too_large"


def test_unknown_model_is_404(fleet: Fleet) -> None:
    with pytest.raises(anthropic.NotFoundError) as exc:
        client(fleet).messages.create(model="claude-nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "claude-nope" in exc.value.body["error"]["message"]  # type: ignore[index]


def test_count_tokens_matches_the_prompt_the_engine_saw(fleet: Fleet) -> None:
    c = client(fleet)
    kwargs: dict[str, Any] = {"model": MODEL, "system": "Count me.", "tools": [WEATHER],
                              "messages": [{"role": "user", "content": "How many tokens is this?"}]}
    counted = c.messages.count_tokens(**kwargs).input_tokens
    reply = c.messages.create(max_tokens=4, tool_choice={"type": "none"}, **kwargs)
    assert counted == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)


def billing_system(nonce: str, separate_block: bool) -> list[dict[str, Any]]:
    header = f"x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch={nonce};"
    prompt = ("You are a careful assistant for a lighthouse keeper. " * 20).strip()
    if separate_block:
        return [{"type": "text", "text": header}, {"type": "text", "text": prompt}]
    return [{"type": "text", "text": header + "\n" + prompt}]


@pytest.mark.parametrize("separate_block", [True, False])
def test_billing_nonce_is_stripped_same_worker_cached(fleet: Fleet, separate_block: bool) -> None:
    c = client(fleet)
    question = f"Is the lamp lit? ({separate_block})"
    workers, replies = [], []
    for _ in range(3):
        raw = c.messages.with_raw_response.create(
            model=MODEL, max_tokens=6, system=billing_system(uuid.uuid4().hex, separate_block),  # type: ignore[arg-type]
            messages=[{"role": "user", "content": question}])
        workers.append(raw.headers["x-infera-worker"])
        replies.append(raw.parse())
    assert len(set(workers)) == 1
    assert len({text_of(r) for r in replies}) == 1  # the engine saw the same prompt every time
    total = replies[0].usage.input_tokens + (replies[0].usage.cache_read_input_tokens or 0)
    for later in replies[1:]:
        assert (later.usage.cache_read_input_tokens or 0) >= total - 16  # all full blocks cached
    counts = {c.messages.count_tokens(model=MODEL, system=billing_system(uuid.uuid4().hex, separate_block),  # type: ignore[arg-type]
                                      messages=[{"role": "user", "content": question}]).input_tokens
              for _ in range(2)}
    assert counts == {total}


def test_metrics_count_anthropic_requests(fleet: Fleet) -> None:
    client(fleet).messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "metrics"}])
    text = scrape(fleet.frontend.url)
    assert metric(text, "infera_requests_total", endpoint="/v1/messages", status="200") >= 1
    assert metric(text, "infera_time_to_first_token_seconds_count", endpoint="/v1/messages") >= 1


def test_framework_errors_use_the_shape_of_the_api_called(fleet: Fleet) -> None:
    anthropic_405 = httpx.get(fleet.frontend.url + "/v1/messages")
    assert anthropic_405.status_code == 405
    body = anthropic_405.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    openai_405 = httpx.get(fleet.frontend.url + "/v1/chat/completions")
    assert openai_405.status_code == 405 and openai_405.json()["error"]["message"]
