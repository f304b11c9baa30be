"""Properties of the pure Anthropic <-> OpenAI translation (hypothesis), no server involved."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera.protocols.anthropic import MessagesRequest
from infera.protocols.anthropic_convert import from_openai, to_openai
from infera.protocols.anthropic_stream import SseDecoder, StreamTranslator
from infera.protocols.openai import ChatCompletionRequest

TEXT = st.text(min_size=1, max_size=20)
NAMES = st.from_regex(r"[a-zA-Z0-9_-]{1,12}", fullmatch=True)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6)
OBJECTS = st.dictionaries(TEXT, JSON, max_size=4)
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def text_content(draw: st.DrawFn) -> str | list[dict[str, Any]]:
    if draw(st.booleans()):
        return draw(TEXT)
    return [{"type": "text", "text": t} for t in draw(st.lists(TEXT, min_size=1, max_size=3))]


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """Valid Anthropic requests: text, system blocks, tool_use answered by tool_result, tools, options."""
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    messages: list[dict[str, Any]] = []
    pending: list[str] = []  # tool_use ids the next user message must answer
    serial = 0
    for turn in range(draw(st.integers(1, 4))):
        blocks: list[dict[str, Any]] = []
        for tool_id in pending:
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id}
            if draw(st.booleans()):
                result["content"] = text_content(draw)
            if draw(st.booleans()):
                result["is_error"] = draw(st.booleans())
            blocks.append(result)
        texts = text_content(draw)
        if not blocks and isinstance(texts, str):
            messages.append({"role": "user", "content": texts})
        else:
            messages.append({"role": "user", "content": blocks + (
                [{"type": "text", "text": texts}] if isinstance(texts, str) else texts)})
        pending = []
        last = turn == 3 or draw(st.booleans())
        if last and draw(st.booleans()):
            break
        content: list[dict[str, Any]] = [{"type": "text", "text": t} for t in draw(st.lists(TEXT, max_size=2))]
        for _ in range(draw(st.integers(0 if content else 1, 2))):
            serial += 1
            pending.append(f"toolu_{serial}")
            content.append({"type": "tool_use", "id": f"toolu_{serial}", "name": draw(st.sampled_from(names)),
                            "input": draw(OBJECTS)})
        messages.append({"role": "assistant", "content": content})
        if last:
            break
    if pending:  # a conversation may end on the assistant's tool_use only as the final message
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": t} for t in pending]})
    body: dict[str, Any] = {"model": "m", "max_tokens": draw(st.integers(1, 4096)), "messages": messages}
    system = draw(st.none() | TEXT | st.lists(TEXT, min_size=1, max_size=3))
    if isinstance(system, list):
        body["system"] = [{"type": "text", "text": t} for t in system]
    elif system is not None:
        body["system"] = system
    if draw(st.booleans()):
        body["tools"] = [{"name": n, "description": draw(TEXT), "input_schema": {"type": "object"}} for n in names]
        body["tool_choice"] = draw(st.sampled_from([
            {"type": "auto"}, {"type": "any", "disable_parallel_tool_use": True}, {"type": "none"},
            {"type": "tool", "name": names[0]}]))
    for name, strategy in (("stop_sequences", st.lists(TEXT, max_size=3)), ("temperature", st.floats(0, 1)),
                           ("top_p", st.floats(0, 1)), ("top_k", st.integers(0, 100)), ("stream", st.booleans()),
                           ("metadata", st.builds(dict, user_id=TEXT))):
        if draw(st.booleans()):
            body[name] = draw(strategy)
    return body


def anthropic_items(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What the model must see, in order: texts by role, tool calls with their input, tool results."""
    def texts(content: Any) -> list[str]:
        return [content] if isinstance(content, str) else [b["text"] for b in content if b["type"] == "text"]

    items: list[tuple[Any, ...]] = [("system", t) for t in texts(body.get("system") or [])]
    for m in body["messages"]:
        content = m["content"]
        blocks = [] if isinstance(content, str) else content
        if m["role"] == "user":
            items += [("tool", b["tool_use_id"], "\n".join(texts(b.get("content", []))), b.get("is_error", False))
                      for b in blocks if b["type"] == "tool_result"]
            items += [("user", t) for t in texts(content)]
        else:
            items += [("assistant", t) for t in texts(content)]
            items += [("call", b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    return items


def openai_items(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    def texts(content: Any) -> list[str]:
        if content is None:
            return []
        return [content] if isinstance(content, str) else [p["text"] for p in content]

    items: list[tuple[Any, ...]] = []
    for m in body["messages"]:
        if m["role"] == "tool":
            error = m["content"].startswith("Error: ")
            items.append(("tool", m["tool_call_id"], m["content"].removeprefix("Error: ") if error else m["content"],
                          error))
            continue
        items += [(m["role"], t) for t in texts(m["content"]) if t or m["role"] != "assistant"]
        items += [("call", c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                  for c in m.get("tool_calls", [])]
    return items


@PROPS
@given(requests())
def test_any_valid_request_maps_to_a_valid_openai_request_losing_nothing(payload: dict[str, Any]) -> None:
    req = MessagesRequest.model_validate(payload)
    body = to_openai(req)
    ChatCompletionRequest.model_validate(body)
    body = orjson.loads(orjson.dumps(body))  # what the engine receives
    assert openai_items(body) == anthropic_items(payload)
    roles = [m["role"] for m in body["messages"]]
    for i, m in enumerate(body["messages"]):  # tool messages follow the assistant turn that asked for them
        if m["role"] == "tool":
            j = max(k for k in range(i) if roles[k] != "tool")
            assert m["tool_call_id"] in {c["id"] for c in body["messages"][j].get("tool_calls", [])}
    assert body["max_tokens"] == payload["max_tokens"]
    assert body.get("stop", []) == (payload.get("stop_sequences") or [])
    assert ("tools" in body) == bool(payload.get("tools"))
    if payload.get("top_p") == 0:
        assert "top_p" not in body and body["top_k"] == 1
    if payload.get("stream"):
        assert body["stream_options"] == {"include_usage": True}


@st.composite
def responses(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    """An engine's chat completion: optional text, tool calls with object arguments, a finish, usage."""
    stops = draw(st.lists(TEXT, max_size=2))
    text = draw(st.none() | TEXT)
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": draw(NAMES),
                                                                   "arguments": json.dumps(draw(OBJECTS))}}
             for i in range(draw(st.integers(0 if text else 1, 3)))]
    finish = "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))
    matched = draw(st.sampled_from(stops)) if stops and finish == "stop" and draw(st.booleans()) else None
    prompt = draw(st.integers(1, 10**5))
    usage = {"prompt_tokens": prompt, "completion_tokens": draw(st.integers(1, 4096)),
             "prompt_tokens_details": {"cached_tokens": draw(st.integers(0, prompt))}}
    choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": calls},
              "finish_reason": finish, "stop_reason": matched}
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [choice], "usage": usage}, stops


@PROPS
@given(responses())
def test_responses_map_back_losing_no_text_or_tool_arguments(case: tuple[dict[str, Any], list[str]]) -> None:
    resp, stops = case
    message = Message.model_validate(from_openai(resp, message_id="msg_1", model="m", stop_sequences=stops))
    choice = resp["choices"][0]
    assert "".join(b.text for b in message.content if b.type == "text") == (choice["message"]["content"] or "")
    assert [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"] == [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in choice["message"]["tool_calls"]]
    expected = {"tool_calls": "tool_use", "length": "max_tokens"}.get(
        choice["finish_reason"], "stop_sequence" if choice["stop_reason"] else "end_turn")
    assert (message.stop_reason, message.stop_sequence) == (expected, choice["stop_reason"])
    usage = resp["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert message.usage.input_tokens == usage["prompt_tokens"] - cached
    assert message.usage.cache_read_input_tokens == cached
    assert message.usage.output_tokens == usage["completion_tokens"]


def pieces(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=4))))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@st.composite
def streams(draw: st.DrawFn) -> tuple[dict[str, Any], list[str], list[bytes]]:
    """A response, and the same response as OpenAI SSE bytes cut at arbitrary points."""
    resp, stops = draw(responses())
    choice = resp["choices"][0]
    calls = choice["message"]["tool_calls"]
    if calls and draw(st.booleans()):  # max_tokens cut the last call's arguments short
        args = calls[-1]["function"]["arguments"]
        calls[-1]["function"]["arguments"] = args[:draw(st.integers(0, len(args)))]
        choice["finish_reason"] = "length"
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}
    chunks: list[dict[str, Any]] = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    for piece in pieces(draw, choice["message"]["content"] or ""):
        chunks.append({**head, "choices": [{"index": 0, "delta": {"content": piece}}]})
    for i, call in enumerate(choice["message"]["tool_calls"]):
        args = pieces(draw, call["function"]["arguments"]) or [""]
        first = {"index": i, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": args[0]}}
        chunks.append({**head, "choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
        for piece in args[1:]:
            chunks.append({**head, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": piece}}]}}]})
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"],
                                        "stop_reason": choice["stop_reason"]}]})
    chunks.append({**head, "choices": [], "usage": resp["usage"]})
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=8))))
    bounds = [0, *cuts, len(raw)]
    return resp, stops, [raw[a:b] for a, b in itertools.pairwise(bounds)]


@PROPS
@given(streams())
def test_a_stream_accumulates_to_the_whole_message(case: tuple[dict[str, Any], list[str], list[bytes]]) -> None:
    resp, stops, wire = case
    translator = StreamTranslator("msg_1", "m", stops)
    decoder = SseDecoder()
    events = translator.start()
    for part in wire:
        for data in decoder.feed(part):
            events += translator.feed(data)
    events += translator.finish()
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    open_block = None
    for name, data in events[1:-2]:  # blocks never overlap and are numbered in order
        if name == "content_block_start":
            assert open_block is None
            open_block = data["index"]
        elif name in ("content_block_delta", "content_block_stop"):
            assert data["index"] == open_block
            open_block = None if name == "content_block_stop" else open_block
    assert open_block is None
    snapshot = None
    bufs: dict[int, bytes] = {}
    for _, data in events:
        snapshot = accumulate_event(event=data, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    whole = Message.model_validate(from_openai(resp, message_id="msg_1", model="m", stop_sequences=stops))
    assert Message.model_validate(snapshot.model_dump()) == whole
