"""API fuzzing shared by the tests and ``bench/fuzz.py``: schemathesis over the published OpenAPI
document, and a catalogue of hostile request bodies.

Every case must get a non-5xx answer in the documented shape (schemathesis checks status codes,
content types, headers and response schemas against the document the server publishes).
Generation is bounded (``examples`` per operation) and derandomized, so a run is reproducible.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import hypothesis
import orjson
from hypothesis import HealthCheck
from hypothesis.strategies import SearchStrategy
from requests.structures import CaseInsensitiveDict
from schemathesis import Case, Response
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Err
from schemathesis.schemas import BaseSchema

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
MAX_OUTPUT = 16  # generated output limits are clamped: the run is about the frontend, not engine time


@dataclasses.dataclass
class FuzzReport:
    cases: int = 0
    statuses: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    by_operation: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


def bound_output(case: Case[Any]) -> None:
    """Clamp generated token limits and choice counts so that engines answer quickly."""
    body: Any = case.body
    if isinstance(body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and body[key] > MAX_OUTPUT:
                body[key] = MAX_OUTPUT
        if isinstance(body.get("n"), int) and body["n"] > 2:
            body["n"] = 2


def fuzz_schema(schema: BaseSchema, examples: int, call: Callable[[Case[Any]], Response],
                headers: Mapping[str, str] | None = None, models: Sequence[str] = ()) -> FuzzReport:
    """Up to ``examples`` generated cases per operation; failures are collected, not raised.

    Every other generated body that names a model names one of ``models`` (the served ones) instead,
    so that half the cases get past the model check to routing, translation and the engines."""
    report = FuzzReport()
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            report.failures.append(f"an operation schemathesis cannot use: {result.err()}")
            continue
        operation = result.ok()
        _fuzz_operation(operation.as_strategy(), f"{operation.method.upper()} {operation.path}", examples, call,
                        headers or {}, models, report)
    return report


def _fuzz_operation(strategy: SearchStrategy[Case[Any]], label: str, examples: int,
                    call: Callable[[Case[Any]], Response], headers: Mapping[str, str], models: Sequence[str],
                    report: FuzzReport) -> None:
    @hypothesis.settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(HealthCheck),
                         phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])
    @hypothesis.given(case=strategy)
    def one(case: Case[Any]) -> None:
        bound_output(case)
        if models and report.cases % 2 == 0 and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = models[report.cases // 2 % len(models)]
        if headers:
            case.headers = CaseInsensitiveDict({**dict(case.headers or {}), **headers})
        report.cases += 1
        report.by_operation[label] += 1
        try:
            response = call(case)
        except Exception as exc:  # a transport failure is a failure of the server too
            report.failures.append(f"{label}: no answer: {exc!r} for {_brief(case.body)}")
            return
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except Exception as exc:
            report.failures.append(f"{label}: {response.status_code}: {str(exc)[:600]} for {_brief(case.body)}")

    one()


def _brief(body: Any) -> str:
    text = repr(body)
    return text if len(text) <= 300 else text[:300] + f"... ({len(text)} chars)"


# ---- hostile bodies ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    body: bytes
    headers: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"content-type": "application/json"})


def _chat(model: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _messages(model: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **extra}


def hostile_bodies(model: str, huge_chars: int = 2 << 20) -> Iterator[Hostile]:
    """Request bodies an attacker or a broken client sends, for every JSON endpoint that takes one.

    ``huge_chars``: the length of the huge strings (under the server's body limit)."""
    deep = 5000
    nested_array = b"[" * deep + b"]" * deep
    nested_object = b'{"a":' * deep + b"1" + b"}" * deep
    deep_content = [{"type": "text", "text": "x", "n": orjson.loads(b'{"a":' * 200 + b"1" + b"}" * 200)}]
    huge = "y" * huge_chars
    kinds: list[tuple[str, Callable[[str], bytes]]] = [
        ("deep-array", lambda _: nested_array),
        ("deep-object", lambda _: nested_object),
        ("deep-inside-content", lambda p: orjson.dumps(_body(p, model, deep_content))),
        ("huge-string-content", lambda p: orjson.dumps(_body(p, model, huge))),
        ("huge-model-name", lambda p: orjson.dumps({**_body(p, model, "hi"), "model": huge})),
        ("huge-key", lambda p: orjson.dumps({**_body(p, model, "hi"), huge: 1})),
        ("many-messages", lambda p: orjson.dumps({**_body(p, model, "hi"),
                                                  "messages": [{"role": "user", "content": "x"}] * 20000})),
        ("invalid-utf8", lambda p: orjson.dumps(_body(p, model, "PLACE")).replace(b"PLACE", b"\xff\xfe\xc3(")),
        ("lone-surrogate", lambda p: orjson.dumps(_body(p, model, "PLACE")).replace(b"PLACE", b"\\ud800")),
        ("nul-bytes", lambda p: orjson.dumps(_body(p, model, "a\x00b\x00"))),
        ("bom", lambda p: b"\xef\xbb\xbf" + orjson.dumps(_body(p, model, "hi"))),
        ("duplicate-keys", lambda p: b'{"model": "nope", ' + orjson.dumps(_body(p, model, "hi"))[1:]),
        ("int-2^64", lambda p: orjson.dumps(_body(p, model, "hi")).replace(b'"max_tokens":4',
                                                                           b'"max_tokens":18446744073709551616')),
        ("int-huge", lambda p: orjson.dumps(_body(p, model, "hi")).replace(b'"max_tokens":4',
                                                                           b'"max_tokens":' + b"9" * 5000)),
        ("float-inf", lambda p: orjson.dumps(_body(p, model, "hi")).replace(b'"max_tokens":4', b'"max_tokens":1e400')),
        ("nan", lambda p: orjson.dumps(_body(p, model, "hi")).replace(b'"max_tokens":4', b'"max_tokens":NaN')),
        ("negative", lambda p: orjson.dumps({**_body(p, model, "hi"), "max_tokens": -1, "temperature": -1e308})),
        ("float-tokens", lambda p: orjson.dumps({**_body(p, model, "hi"), "max_tokens": 4.5})),
        ("wrong-types", lambda p: orjson.dumps({"model": 1, "messages": {"role": 2}, "prompt": {"a": []},
                                                "max_tokens": "many", "stream": "yes"})),
        ("null-everything", lambda p: orjson.dumps({"model": None, "messages": None, "prompt": None,
                                                    "max_tokens": None})),
        ("empty-body", lambda _: b""),
        ("not-json", lambda _: b"model=x&messages=y"),
        ("top-level-string", lambda _: b'"hello"'),
        ("trailing-garbage", lambda p: orjson.dumps(_body(p, model, "hi")) + b"}}]]garbage"),
        ("truncated", lambda p: orjson.dumps(_body(p, model, "hi"))[:-7]),
        ("unicode-storm", lambda p: orjson.dumps(_body(p, model, "\u202e\u0338\ufeff\U0001f600" * 5000))),
    ]
    for path in JSON_PATHS:
        for name, make in kinds:
            yield Hostile(name, path, make(path))
    # headers a client should not be able to hurt anyone with
    for path in JSON_PATHS[:1]:
        ok = orjson.dumps(_body(path, model, "hi"))
        yield Hostile("wrong-content-type", path, ok, {"content-type": "text/plain"})
        yield Hostile("huge-request-id", path, ok, {"content-type": "application/json", "x-request-id": "r" * 8000})
        yield Hostile("bogus-worker-header", path, ok, {"content-type": "application/json",
                                                        "x-worker-instance-id": "../../etc/passwd"})


JSON_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
              "/v1/cache/prewarm", "/v1/admin/profile/start")


def _body(path: str, model: str, content: Any) -> dict[str, Any]:
    if path == "/v1/completions":
        return {"model": model, "prompt": content, "max_tokens": 4}
    if path.startswith("/v1/messages"):
        return _messages(model, content)
    if path == "/v1/cache/prewarm":
        return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4}  # ignored
    return _chat(model, content)


def shaped(path: str, status: int, content_type: str, body: bytes) -> str | None:
    """None when an answer is in the shape the API documents for ``path``, else what is wrong."""
    if status >= 500:
        return f"a {status}: {body[:300]!r}"
    if status == 499 or content_type.startswith("text/event-stream"):
        return None
    if not content_type.startswith("application/json"):
        return f"content type {content_type!r}"
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "a body that is not JSON"
    if status < 400:
        return None if isinstance(data, dict) else "a success body that is not an object"
    if path.startswith("/v1/messages"):
        ok = isinstance(data, dict) and data.get("type") == "error" and isinstance(data.get("error"), dict) \
            and isinstance(data["error"].get("message"), str)
        return None if ok else f"not Anthropic's error shape: {body[:200]!r}"
    if path.startswith("/v1/admin/profile") and isinstance(data, dict) and "workers" in data:
        return None  # the profiler's per-worker result
    ok = isinstance(data, dict) and isinstance(data.get("error"), dict) \
        and isinstance(data["error"].get("message"), str)
    return None if ok else f"not OpenAI's error shape: {body[:200]!r}"
