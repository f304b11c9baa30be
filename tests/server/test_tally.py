"""The relay's tally finds the end marker and the usage object in raw SSE bytes, however split."""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.server.tally import StreamTally, Usage, usage_of

HEAD = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
USAGE = {"prompt_tokens": 1234, "completion_tokens": 16, "total_tokens": 1250,
         "prompt_tokens_details": {"cached_tokens": 1024}}


def sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream(*, usage: bool = True, done: bool = True, null_usage: bool = False, text: str = "hi") -> bytes:
    extra = {"usage": None} if null_usage else {}
    out = b"".join(sse({**HEAD, "choices": [{"index": 0, "delta": {"content": text}}], **extra}) for _ in range(5))
    if usage:
        out += sse({**HEAD, "choices": [], "usage": USAGE})
    return out + (b"data: [DONE]\n\n" if done else b"")


def tally_of(data: bytes, cuts: list[int]) -> StreamTally:
    tally = StreamTally()
    edges = [0, *sorted(cuts), len(data)]
    for a, b in itertools.pairwise(edges):
        if b > a:
            tally.feed(data[a:b])
    return tally


def test_a_whole_stream_in_one_chunk() -> None:
    tally = StreamTally.of(stream())
    assert tally.done
    assert tally.usage() == Usage(1234, 16, 1024)


@pytest.mark.parametrize("null_usage", [False, True])
def test_every_split_point_finds_the_marker_and_the_usage(null_usage: bool) -> None:
    data = stream(null_usage=null_usage)
    for cut in range(1, len(data)):
        tally = tally_of(data, [cut])
        assert tally.done, cut
        assert tally.usage() == Usage(1234, 16, 1024), cut


def test_byte_by_byte() -> None:
    data = stream(null_usage=True)
    tally = tally_of(data, list(range(1, len(data))))
    assert tally.done and tally.usage() == Usage(1234, 16, 1024)


def test_no_marker_no_usage() -> None:
    data = stream(usage=False, done=False, null_usage=True)
    for cut in range(1, len(data), 7):
        tally = tally_of(data, [cut])
        assert not tally.done and tally.usage() is None


def test_generated_text_cannot_fake_either() -> None:
    data = stream(usage=False, done=False, text='data: [DONE]\n\n"usage": {"prompt_tokens": 9}')
    assert b"[DONE]" in data and b"usage" in data
    tally = StreamTally.of(data)
    assert not tally.done and tally.usage() is None


def test_the_last_usage_wins() -> None:
    first = sse({**HEAD, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    data = first + stream()
    assert StreamTally.of(data).usage() == Usage(1234, 16, 1024)


def test_a_non_streamed_body() -> None:
    body = orjson.dumps({"id": "x", "choices": [{"message": {"content": "usage"}}], "usage": USAGE})
    tally = StreamTally.of(body)
    assert not tally.done and tally.usage() == Usage(1234, 16, 1024)


def test_usage_of_a_whole_answer() -> None:
    body = orjson.dumps({"id": "x", "choices": [{"message": {"content": "usage"}}], "usage": USAGE})
    assert usage_of(body) == Usage(1234, 16, 1024)
    assert usage_of(orjson.dumps({"id": "x", "usage": None})) is None
    assert usage_of(b'{"id": "x", "usage": {"total_tokens": 3}}') is None
    assert usage_of(b"") is None
    far = b'"usage": {' + b"x" * 5000 + b'"prompt_tokens": 5}'  # past the bytes a usage event is read to
    assert usage_of(far) is None and usage_of(far + b"\n\n") is None


# the pieces a body is made of: usage keys (some null, some spaced, some cut short), count fields, event ends
_PIECES = st.sampled_from([b'"usage":', b'"usage": ', b'"usage":null', b'"usage": null', b'"usage":\n{', b"{", b"}",
                           b'"prompt_tokens":', b'"completion_tokens": ', b'"cached_tokens":\t', b"12", b"7", b" ",
                           b"null", b",", b"\n", b"\n\n", b"data: ", b'"total_tokens":3', b"x" * 5000])


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=30))
def test_usage_of_reads_what_a_tally_of_the_whole_body_reads(pieces: list[bytes]) -> None:
    body = b"".join(pieces)
    assert usage_of(body) == StreamTally.of(body).usage()


class _Reference:
    """The tally's scan as it was before issue 15's fourteenth round (a seam of the chunk's first bytes, each
    marker searched in it and in the chunk): the one-search scan must keep what this keeps, chunk by chunk."""

    def __init__(self) -> None:
        self.done = False
        self._seam = b"\n"
        self._usage = b""
        self._open = False

    def feed(self, chunk: bytes) -> None:
        done, usage, seam_n, keep = b"\ndata: [DONE]", b'"usage":', 12, 4096
        if self._open:
            self._usage += chunk[:keep - len(self._usage)]
            self._open = b"\n\n" not in self._usage and len(self._usage) < keep
        seam = self._seam + chunk[:seam_n]
        if not self.done and (done in chunk or done in seam):
            self.done = True
        at = chunk.rfind(usage)
        if at >= 0:
            self._keep(chunk, at)
        else:
            at = seam.rfind(usage)
            if at >= 0 and at + len(usage) > len(self._seam):
                self._keep(seam + chunk[seam_n:], at)
        self._seam = chunk[-seam_n:] if len(chunk) >= seam_n else (self._seam + chunk)[-seam_n:]

    def _keep(self, data: bytes, at: int) -> None:
        if data[at + 8:at + 13].lstrip().startswith(b"n"):
            return
        self._usage = data[at:at + 4096]
        self._open = b"\n\n" not in self._usage and len(self._usage) < 4096


_STREAM_PIECES = st.one_of(_PIECES, st.sampled_from([b"data: [DONE]", b"\ndata: [DONE]\n\n", b"[DONE]", b"data:",
                                                      b"\nd", b"ata: [DO", b"NE]", b'"us', b'age":', b'"u']))


@settings(max_examples=400, deadline=None)
@given(st.lists(_STREAM_PIECES, max_size=40), st.lists(st.integers(0, 6000), max_size=12))
def test_the_one_search_scan_keeps_what_the_two_search_scan_kept(pieces: list[bytes], cuts: list[int]) -> None:
    body = b"".join(pieces)
    tally, reference = StreamTally(), _Reference()
    edges = [0, *sorted(c for c in cuts if c < len(body)), len(body)]
    for a, b in itertools.pairwise(edges):
        tally.feed(body[a:b])
        reference.feed(body[a:b])
        assert (tally.done, tally._usage, tally._open, tally._seam) == (
            reference.done, reference._usage, reference._open, reference._seam)
