"""The C OTLP encoder (csrc/otlp.c) writes the bytes the Python one writes, for every kind of record a request
makes and the attribute values spans carry; what it does not cover it leaves to Python."""

from __future__ import annotations

import random

import pytest
from opentelemetry.trace import SpanKind, TraceState

from infera.telemetry.otlp import Encoder
from infera.telemetry.record import _INTAKE, _INTAKE_REFUSED, _PICK, _TOKENIZE
from infera.telemetry.spans import Shape, Span, Stage

native = pytest.importorskip("infera.telemetry._otlp", reason="the C encoder is not built")


@pytest.fixture(autouse=True)
def _c_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C encoder in use (set up by an Encoder) even in a run that turns it off with INFERA_PURE_PYTHON."""
    monkeypatch.delenv("INFERA_PURE_PYTHON", raising=False)
    assert Encoder()._native is native

START = 1_764_000_000_123_456_789
VALUES = [0, 1, 127, 128, 16383, 16384, 1 << 40, (1 << 63) - 1, -1, -(1 << 63), True, False, 0.0, 3.25, -1e300,
          float("inf"), "", "w1", "é" * 200, "x" * 5000, b"\x00\xff", ["a", "b"], [], ("w1", "w2"), [1, 2.5, True],
          [["a"], ["b", 3]]]


def request(rng: random.Random, state: TraceState, remote: bool, description: str | None,
            extra: dict[str, object]) -> tuple[Span, list[Span | Stage]]:
    root = Span("POST /v1/chat/completions", rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, state,
                None, SpanKind.SERVER, START, {"http.request.method": "POST", "url.path": "/v1/chat/completions",
                                               "infera.request_id": "5f0c", **extra})
    root.remote = remote
    root.parent_id = rng.getrandbits(64) if remote else 0
    root.description = description
    root.end = START + 9_000_000
    leg = Span("leg mixed", root.trace_id, rng.getrandbits(64) or 1, state, root.span_id, SpanKind.CLIENT,
               START + 1000, {"infera.role": "mixed", "infera.worker": "w1"})
    leg.events.append(("first_byte", START + 2000))
    leg.close(START + 3000)
    failed = Span("leg prefill", root.trace_id, 5, state, root.span_id, SpanKind.CLIENT, START + 10, {})
    failed.error("")
    failed.close(START + 20)
    stages: list[Span | Stage] = [
        ("intake", START, START + 5, _INTAKE, (611,)),
        ("intake", START, START + 5, _INTAKE_REFUSED, (0, "request body exceeds 10 bytes", 413)),
        ("tokenize", START + 6, START + 7, _TOKENIZE, (1000, True)),
        ("pick", START + 8, START + 9, _PICK, ("mixed", "kv-aware", "w1", "cache-hit", 6, 28.2, 2)),
        ("pick", START + 8, START + 9, _PICK, ("decode", "kv-aware", "w2", "load", 200, -1.5, 16384)),
        ("empty", START, START, Shape(()), ()),
    ]
    return root, [*stages, failed, leg]


@pytest.mark.parametrize("state", [TraceState(), TraceState([("vendor", "x1"), ("other", "y")])])
@pytest.mark.parametrize("remote", [False, True])
@pytest.mark.parametrize("description", [None, "", "status 502", "é" * 100])
def test_the_c_encoder_writes_a_requests_records_as_python_does(state: TraceState, remote: bool,
                                                                description: str | None) -> None:
    c, python = Encoder(), Encoder(native=False)
    assert c._native is not None and python._native is None
    rng = random.Random(7)
    for i, value in enumerate([*VALUES, None]):
        extra = {} if value is None else {f"infera.k{i}": value, "k" * 150: value}
        root, children = request(rng, state, remote, description, extra)
        for _ in range(2):  # the second time Python writes from its kept encodings
            ours = c.records(root, children, random.Random(i).getrandbits)
            assert ours == python.records(root, children, random.Random(i).getrandbits), value
    assert len(ours) > 1000


def test_a_value_the_c_encoder_does_not_write_is_left_to_python() -> None:
    c, python = Encoder(), Encoder(native=False)
    for value in ({"a": 1}, 1 << 64, -(1 << 63) - 1, {"a"}, None):
        root, children = request(random.Random(1), TraceState(), False, None, {"odd": value})
        assert native.records(root, children, random.getrandbits, b"") is None, value
        if value is not None and not isinstance(value, set):  # both write what Python writes (the stages'
            # ids drawn again after C gave up: one id for all here, so the draws do not matter)
            assert c.records(root, children, lambda bits: 12345) == python.records(root, children, lambda bits: 12345)
        else:  # Python refuses it, through either
            with pytest.raises(TypeError):
                c.records(root, children, random.getrandbits)


def test_an_unknown_span_kind_or_mismatched_stage_is_left_to_python() -> None:
    root, children = request(random.Random(1), TraceState(), False, None, {})
    root.kind = "server"  # type: ignore[assignment]
    assert native.records(root, children, random.getrandbits, b"") is None
    root.kind = SpanKind.SERVER
    bad: Stage = ("pick", START, START, _PICK, ("mixed",))
    assert native.records(root, [bad], random.getrandbits, b"") is None
    with pytest.raises(ValueError, match="zip"):  # zip(strict=True)
        Encoder().records(root, [bad], random.getrandbits)


def test_pure_python_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_PURE_PYTHON", "1")
    assert Encoder()._native is None
    monkeypatch.setenv("INFERA_PURE_PYTHON", "0")
    assert Encoder()._native is not None
