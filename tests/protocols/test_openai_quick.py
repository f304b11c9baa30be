"""The hot path's quick checks of OpenAI requests never pass what the pydantic models refuse, read the same
model and output limit, and pass the ordinary requests (else the hot path would not use them)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infera.protocols.openai import (
    ChatCompletionRequest,
    Checked,
    CompletionRequest,
    ValidationError,
    check_chat,
    check_completion,
)

ABSENT = object()
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.integers(2**32 - 2, 2**32 + 1),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["", "m", "true", "1", "user"]))
anything = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.sampled_from(["type", "text", "role"]),
                                                                         inner, max_size=2)), max_leaves=6)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])
contents = st.one_of(st.none(), st.text(max_size=5), st.lists(st.fixed_dictionaries({"text": st.text(max_size=3)}),
                                                              max_size=2))
message = st.fixed_dictionaries({"role": roles}, optional={"content": contents, "name": st.text(max_size=2)})
token_ids = st.lists(st.integers(0, 2**32 - 1), max_size=3)
# each field: valid values (edges included); one or two fields of a request are then replaced by near misses
# or anything, so that most requests are invalid in one place only
valid_common: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["m", "bench-model"]),
    "stream": st.booleans(),
    "stream_options": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"include_usage": st.one_of(
        st.none(), st.booleans())})),
    "max_tokens": st.one_of(st.none(), st.integers(1, 5)),
    "n": st.integers(1, 128),
    "temperature": st.one_of(st.none(), st.floats(0, 2), st.sampled_from([0, 2])),
    "top_p": st.one_of(st.none(), st.floats(0, 1, exclude_min=True), st.just(1)),
    "stop": st.one_of(st.none(), st.text(max_size=2), st.lists(st.text(max_size=2), max_size=2)),
    "seed": anything,
}
near_common: dict[str, list[Any]] = {
    "model": ["", 1, None],
    "stream": [None, 0, 1, "true"],
    "stream_options": [{"include_usage": "yes"}, {"include_usage": 1}, [], "x"],
    "max_tokens": [0, -1, 1.0, 2.5, True, "3"],
    "n": [0, 129, None, 1.0, True],
    "temperature": [-0.1, 2.01, float("inf"), float("nan"), "1", True],
    "top_p": [0, 0.0, 1.01, -1, "0.5", False],
    "stop": [1, [1], ["a", None], {"a": 1}],
}
valid_chat = {**valid_common, "messages": st.lists(message, min_size=1, max_size=3),
              "max_completion_tokens": st.one_of(st.none(), st.integers(1, 5)),
              "tools": st.one_of(st.none(), st.lists(st.fixed_dictionaries({"type": st.just("function")}), max_size=2))}
near_chat: dict[str, list[Any]] = {
    **near_common,
    "messages": [[], [{"role": "bot"}], [{"role": "User"}], [{"content": "x"}], ["user"], {"role": "user"},
                 [{"role": "user", "content": 1}], [{"role": "user", "content": ["x"]}], [{"role": ["user"]}]],
    "max_completion_tokens": [0, -2, 1.5, "4", False],
    "tools": [{}, ["f"], [1], "f"],
}
valid_completion = {**valid_common, "prompt": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=2), max_size=2),
                                                        token_ids, st.lists(token_ids, max_size=2))}
near_completion: dict[str, list[Any]] = {
    **near_common,
    "prompt": [None, 1, [-1], [2**32], [[2**32]], [1, "a"], [[1], 2], [1.0], [True], {"a": 1}, [["a"]]],
}

@st.composite
def payloads(draw: st.DrawFn, valid: dict[str, st.SearchStrategy[Any]],
             near: dict[str, list[Any]]) -> dict[str, Any]:
    """A request with each field absent or valid, then up to two fields absent, near misses or anything
    (round-tripped through orjson, as intake reads it)."""
    payload = {k: v for k, v in draw(st.fixed_dictionaries(
        {k: st.one_of(st.just(ABSENT), v) for k, v in valid.items()})).items() if v is not ABSENT}
    payload.setdefault("model", "m")
    for name in draw(st.lists(st.sampled_from(sorted(valid)), max_size=2, unique=True)):
        options = [st.just(ABSENT), anything] + ([st.sampled_from(near[name])] * 3 if name in near else [])
        value = draw(st.one_of(*options))
        if value is ABSENT:
            payload.pop(name, None)
        else:
            payload[name] = value
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(payload))
    return loaded


def agrees(checked: Checked | None, schema: type[ChatCompletionRequest | CompletionRequest],
           payload: dict[str, Any]) -> None:
    try:
        parsed = schema.model_validate(payload)
    except ValidationError:
        assert checked is None, f"quick check passed what the model refuses: {payload!r}"
        return
    if checked is not None:
        assert (checked.model, checked.output_limit()) == (parsed.model, parsed.output_limit())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads(valid_chat, near_chat))
def test_a_chat_request_the_quick_check_passes_is_one_the_model_passes(payload: dict[str, Any]) -> None:
    agrees(check_chat(payload), ChatCompletionRequest, payload)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads(valid_completion, near_completion))
def test_a_completion_request_the_quick_check_passes_is_one_the_model_passes(payload: dict[str, Any]) -> None:
    agrees(check_completion(payload), CompletionRequest, payload)


ORDINARY_CHATS: list[dict[str, Any]] = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
     "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.7, "top_p": 1,
     "n": 1, "stop": ["\n"], "seed": 3},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                                {"role": "tool", "content": "42", "tool_call_id": "1"}],
     "tools": [{"type": "function", "function": {"name": "f"}}], "max_completion_tokens": 5, "max_tokens": 9},
]


@pytest.mark.parametrize("payload", ORDINARY_CHATS)
def test_ordinary_chat_requests_take_the_quick_check(payload: dict[str, Any]) -> None:
    checked = check_chat(payload)
    assert checked is not None
    agrees(checked, ChatCompletionRequest, payload)


@pytest.mark.parametrize("prompt", ["hi", ["a", "b"], [1, 2, 2**32 - 1], [[1, 2], [3]], []])
def test_ordinary_completion_requests_take_the_quick_check(prompt: Any) -> None:
    payload = {"model": "m", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    checked = check_completion(payload)
    assert checked is not None
    agrees(checked, CompletionRequest, payload)


NEAR_MISSES = [(kind, name, value) for kind, near in (("chat", near_chat), ("completion", near_completion))
               for name, values in near.items() for value in values]


@pytest.mark.parametrize(("kind", "name", "value"), NEAR_MISSES)
def test_every_near_miss_alone_is_left_to_the_model(kind: str, name: str, value: Any) -> None:
    base = dict(ORDINARY_CHATS[1]) if kind == "chat" else {"model": "m", "prompt": [1, 2], "max_tokens": 4}
    payload = orjson.loads(orjson.dumps({**base, name: value}))
    if kind == "chat":
        agrees(check_chat(payload), ChatCompletionRequest, payload)
    else:
        agrees(check_completion(payload), CompletionRequest, payload)
