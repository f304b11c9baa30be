"""Edge cases of the Anthropic translation that the properties do not reach by chance."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from infera.config.server import BILLING_HEADER_PATTERN
from infera.protocols.anthropic import MessagesRequest, TranslationError, ValidationError, describe_error
from infera.protocols.anthropic_convert import from_openai, stop_reason, strip_system, to_openai, tool_input
from infera.protocols.anthropic_stream import SseDecoder, StreamError, StreamTranslator

BILLING = [re.compile(BILLING_HEADER_PATTERN)]


def chunk(delta: dict[str, Any] | None = None, **choice: Any) -> str:
    return orjson.dumps({"choices": [{"index": 0, "delta": delta or {}, **choice}]}).decode()


def run(datas: list[str]) -> list[tuple[str, dict[str, Any]]]:
    t = StreamTranslator("msg_x", "m", None)
    events = t.start()
    for d in datas:
        events += t.feed(d)
    return events + t.finish()


def test_text_then_tool_then_text_are_three_blocks() -> None:
    events = run([chunk({"content": "a"}),
                  chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}),
                  chunk({"content": "b"}), chunk(finish_reason="tool_calls")])
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["text", "tool_use", "text"]
    assert [d["index"] for n, d in events if n == "content_block_stop"] == [0, 1, 2]


def test_a_tool_name_that_arrives_late_loses_no_argument_fragment() -> None:
    events = run([chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": '{"a"'}}]}),
                  chunk({"tool_calls": [{"index": 0, "function": {"name": "lookup", "arguments": ": 1}"}}]}),
                  chunk(finish_reason="tool_calls")])
    start = next(d for n, d in events if n == "content_block_start")["content_block"]
    assert start == {"type": "tool_use", "id": "c1", "name": "lookup", "input": {}}
    assert "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta") == '{"a": 1}'


def test_a_tool_call_without_an_id_gets_the_same_id_streamed_or_not() -> None:
    events = run([chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}),
                  chunk(finish_reason="tool_calls")])
    streamed = next(d for n, d in events if n == "content_block_start")["content_block"]["id"]
    whole = from_openai({"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
                                      "finish_reason": "tool_calls"}]}, message_id="msg_x", model="m",
                        stop_sequences=None)
    assert streamed == whole["content"][0]["id"]


def test_interleaved_tool_fragments_are_an_error_not_a_silent_drop() -> None:
    t = StreamTranslator("msg_x", "m", None)
    t.feed(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]}))
    t.feed(chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}}]}))
    with pytest.raises(StreamError, match="interleaved"):
        t.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}))


def test_engine_error_chunks_and_early_ends_raise() -> None:
    t = StreamTranslator("msg_x", "m", None)
    with pytest.raises(StreamError, match="boom"):
        t.feed('{"error": {"message": "boom", "type": "upstream_error"}}')
    t = StreamTranslator("msg_x", "m", None)
    t.feed(chunk({"content": "partial"}))
    with pytest.raises(StreamError, match="ended before"):
        t.finish()


def test_sse_decoder_handles_crlf_multiline_data_and_any_cut() -> None:
    raw = b'data: {"a":\r\ndata: 1}\r\n\r\n: comment\n\ndata: [DONE]\n\n'
    for cut in range(len(raw) + 1):
        decoder = SseDecoder()
        assert decoder.feed(raw[:cut]) + decoder.feed(raw[cut:]) == ['{"a":\n1}', "[DONE]"]


def request(**fields: Any) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 4,
                                           "messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.mark.parametrize("nonce", ["abc", "0123456789"])
def test_billing_nonce_is_stripped_from_the_system_prompt(nonce: str) -> None:
    line = f"x-anthropic-billing-header: cc_version=2.0; cch={nonce};"
    as_line = request(system=f"{line}\nYou are helpful.")
    as_block = request(system=[{"type": "text", "text": line}, {"type": "text", "text": "You are helpful."}])
    assert strip_system(as_line, BILLING) and strip_system(as_block, BILLING)
    assert to_openai(as_line)["messages"][0] == to_openai(as_block)["messages"][0] == {
        "role": "system", "content": "You are helpful."}
    untouched = request(system="You are helpful.")
    assert not strip_system(untouched, BILLING) and untouched.system == "You are helpful."


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
         "messages.0.content.0.extra: Extra inputs are not permitted"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
         "'tool_use' blocks are not allowed in user messages"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}, {"role": "user", "content": "y"}]},
         "tool_use ids were found without tool_result blocks immediately after: a"),
        ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools.0.input_schema"),
        ({"top_k": -1}, "top_k: Input should be greater than or equal to 0"),
    ],
)
def test_validation_errors_name_the_field(fields: dict[str, Any], message: str) -> None:
    payload = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(ValidationError) as exc:
        MessagesRequest.model_validate(payload)
    assert message in describe_error(exc.value, payload)


def test_stop_reasons() -> None:
    assert stop_reason("stop", "END", ["END"], False) == ("stop_sequence", "END")
    assert stop_reason("stop", 151645, ["END"], False) == ("end_turn", None)  # SGLang: an eos token id
    assert stop_reason("stop", "other", ["END"], False) == ("end_turn", None)
    assert stop_reason("length", None, None, True) == ("max_tokens", None)
    assert stop_reason("stop", None, None, True) == ("tool_use", None)


def test_tool_input_wants_a_json_object() -> None:
    assert tool_input('{"a": [1, 2]}') == {"a": [1, 2]}
    assert tool_input('{"a": [1, 2', truncated=True) == {"a": [1, 2]}
    with pytest.raises(TranslationError):
        tool_input("[1]")
    with pytest.raises(TranslationError):
        tool_input("{nope")


def test_final_assistant_turn_is_continued_and_top_p_zero_is_greedy() -> None:
    body = to_openai(request(messages=[{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "The answer is"}], top_p=0))
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": "The answer is"}
    assert "top_p" not in body and body["top_k"] == 1
