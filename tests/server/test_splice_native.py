"""The C chunk sink (``ChunkSink``, csrc/splice.c) against the relay's Python sink it stands in for: for any
stream split at any byte offsets, the same bytes reach the client's transport, the same answers go back to
the reader, the tally ends in the same state and the observation counts the same (a chunk split inside the
end marker, inside ``"usage":``, SGLang's ``"usage": null`` on every chunk, Anthropic event streams)."""

from __future__ import annotations

import itertools
import math
import time
import types
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.server import splice
from infera.server.metrics import Buckets
from infera.server.observe import Observation
from infera.server.relay import Spliced
from infera.server.splice import CycleWriter
from infera.server.tally import StreamTally

pytestmark = pytest.mark.skipif(splice._native is None, reason="the C extension is not built")

HEAD = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
USAGE = {"prompt_tokens": 1234, "completion_tokens": 16, "total_tokens": 1250,
         "prompt_tokens_details": {"cached_tokens": 1024}}


def sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def openai(texts: list[str], usage: str, done: bool) -> bytes:
    extra = {"usage": None} if usage == "null" else {}
    out = b"".join(sse({**HEAD, "choices": [{"index": 0, "delta": {"content": t}}], **extra}) for t in texts)
    if usage in ("last", "null"):
        out += sse({**HEAD, "choices": [], "usage": USAGE})
    return out + (b"data: [DONE]\n\n" if done else b"")


def anthropic(texts: list[str], done: bool) -> bytes:
    def event(name: str, obj: object) -> bytes:
        return b"event: " + name.encode() + b"\n" + sse(obj)

    out = event("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 7,
                                                                                 "output_tokens": 1}}})
    out += b"".join(event("content_block_delta", {"type": "content_block_delta",
                                                  "delta": {"type": "text_delta", "text": t}}) for t in texts)
    out += event("message_delta", {"type": "message_delta", "usage": {"output_tokens": len(texts)}})
    return out + (event("message_stop", {"type": "message_stop"}) if done else b"")


class Transport:
    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def close(self) -> None:
        self.out.append(b"<close>")


def cycle(transport: Transport, paused: Callable[[], bool]) -> Any:
    """What CycleWriter reads and sets of uvicorn's cycle; ``flow.write_paused`` asks ``paused`` each time."""
    class Flow:
        @property
        def write_paused(self) -> bool:
            return paused()

    return types.SimpleNamespace(response_started=True, response_complete=False, chunked_encoding=True,
                                 scope={"method": "POST"}, disconnected=False, transport=transport, flow=Flow(),
                                 keep_alive=True, message_event=types.SimpleNamespace(set=lambda: None),
                                 on_response=lambda: None)


def observation() -> Observation:
    seen = Observation.__new__(Observation)
    seen.record = types.SimpleNamespace(output_tokens=-1)  # type: ignore[assignment]
    seen.events = 0
    return seen


def relay(chunks: list[bytes], native: bool, pauses: list[bool], observed: bool = True) -> tuple[Any, ...]:
    """The relay's spliced path over ``chunks`` (the first one sent before the splice, as SseRelay does)."""
    transport = Transport()
    answers = iter(itertools.cycle(pauses or [False]))
    cyc = cycle(transport, lambda: next(answers))
    seen = observation() if observed else None
    writer = CycleWriter(cyc, seen)
    tally = StreamTally()
    tally.feed(chunks[0])
    gaps: list[float] = []
    ended = tally.done
    results: list[bool] = []
    if not ended:
        def finish(chunk: bytes) -> bool:
            nonlocal ended
            ended = True
            return writer.write(chunk, False)

        def take(chunk: bytes) -> bool:
            nonlocal ended
            if ended:
                return True
            gaps.append(0.0)
            tally.feed(chunk)
            ended = tally.done
            return writer.write(chunk, not ended)

        sink: Spliced | None = writer.splice(tally, time.perf_counter(), finish) if native else None
        call = take if sink is None else sink.take
        assert (sink is not None) == native
        results = [call(chunk) for chunk in chunks[1:]]
        if sink is not None:
            writer.settle(sink, tally, gaps.append)
    # the output token count Observation.close records (its events only count while no usage was read: the C
    # sink counts "data: " on regardless, as the sum is then never read)
    tokens = None
    if seen is not None:
        tokens = seen.record.output_tokens
        if tokens < 0 and seen.events:
            tokens = max(0, seen.events - 1)
    return (b"".join(transport.out), results, tally.state(), tally.usage(), len(gaps), tokens,
            cyc.response_complete)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = sorted({0, *(c % (len(data) + 1) for c in cuts), len(data)})
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a] or [b""]


texts = st.lists(st.text(alphabet="ab \n\"\\:{}[]", max_size=12), min_size=1, max_size=8)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return openai(draw(texts), draw(st.sampled_from(["none", "last", "null"])), draw(st.booleans()))
    return anthropic(draw(texts), draw(st.booleans()))


@given(streams(), st.lists(st.integers(min_value=0, max_value=1 << 14), max_size=40),
       st.lists(st.booleans(), max_size=5), st.booleans())
@settings(max_examples=400, deadline=None)
def test_the_c_sink_writes_and_counts_what_the_python_sink_does(data: bytes, cuts: list[int],
                                                                  pauses: list[bool], observed: bool) -> None:
    chunks = split(data, cuts)
    assert relay(chunks, True, pauses, observed) == relay(chunks, False, pauses, observed)


@pytest.mark.parametrize("usage", ["last", "null"])
def test_every_split_point_and_byte_by_byte(usage: str) -> None:
    data = openai(["x", "y", "z"], usage, True)
    for cut in range(1, len(data)):
        chunks = [data[:cut], data[cut:]]
        assert relay(chunks, True, []) == relay(chunks, False, []), cut
    for first in range(1, 40):
        chunks = [data[:first], *(data[i:i + 1] for i in range(first, len(data)))]
        assert relay(chunks, True, []) == relay(chunks, False, []), first


def test_a_long_usage_event_is_kept_to_the_same_bound() -> None:
    data = sse({**HEAD, "choices": [], "usage": {**USAGE, "pad": "x" * 9000}}) + b"data: [DONE]\n\n"
    for size in (1, 7, 100, 4095, 4096, 5000):
        chunks = [b"data: {}\n\n", *(data[i:i + size] for i in range(0, len(data), size))]
        assert relay(chunks, True, []) == relay(chunks, False, []), size


def test_a_left_client_takes_no_write_and_a_completed_response_raises() -> None:
    transport = Transport()
    cyc = cycle(transport, lambda: False)
    writer = CycleWriter(cyc, None)
    tally = StreamTally()
    tally.feed(b"data: {}\n\n")
    sink = writer.splice(tally, time.perf_counter(), lambda chunk: True)
    assert sink is not None
    assert sink.take(b"data: {}\n\n") is True
    cyc.disconnected = True
    assert sink.take(b"data: {}\n\n") is True
    cyc.disconnected = False
    cyc.response_complete = True
    with pytest.raises(RuntimeError, match="after response already completed"):
        sink.take(b"data: {}\n\n")
    assert transport.out == [b"a\r\ndata: {}\n\n\r\n"]
    assert len(sink.gaps()) == 3


def test_the_gaps_go_into_the_bucket_of_the_first_bound_that_holds_them() -> None:
    transport = Transport()
    writer = CycleWriter(cycle(transport, lambda: False), None)
    tally = StreamTally()
    tally.feed(b"data: {}\n\n")
    buckets = Buckets([0.0, 1e9, math.inf], lambda counts, total: None)
    started = time.perf_counter()
    sink = writer.splice(tally, started, lambda chunk: True, buckets)
    assert sink is not None
    for _ in range(5):
        assert sink.take(b"data: {}\n\n")
    elapsed = time.perf_counter() - started
    counts, total = sink.buckets()
    assert counts == [0, 5, 0] and 0 < total <= elapsed
    assert sink.gaps() == [] and sink.buckets() == ([0, 0, 0], 0.0)  # emptied by the read
