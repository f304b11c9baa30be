"""A streamed chunk's Python work in the frontend, frame by frame, and the C sink that replaces the relay's part
(issue 15, fifteenth round, helper splice17).

In process, no sockets: one ~200-byte SSE event (an OpenAI chunk with ``"usage": null``, as SGLang sends) through

- the upstream side as it runs per socket read: ``Connection.data_received`` -> httptools -> ``on_body`` ->
  ``BodyReader.feed`` -> ``flush`` -> ``_take`` -> the sink (here a no-op);
- the relay's Python sink (the gap sample into the real histogram child, ``StreamTally.feed``,
  ``CycleWriter.write`` with ``Observation.body``, the chunked write to a transport whose ``write`` is
  ``list.append``), and each of its parts alone;
- ``ChunkSink.take`` (csrc/splice.c) doing the same.

    PYTHONPATH=$PWD .venv/bin/python bench/splice_frames.py
"""

from __future__ import annotations

import asyncio
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
from prometheus_client import CollectorRegistry, Histogram

from infera.server.metrics import Buckets, fast_buckets, fast_observe
from infera.server.observe import Observation
from infera.server.splice import CycleWriter
from infera.server.tally import StreamTally
from infera.transport.http_wire import BodyReader, Connection

EVENT = b"data: " + orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                                    "model": "m", "choices": [{"index": 0, "delta": {"content": " word"},
                                                               "finish_reason": None}], "usage": None}) + b"\n\n"
N = 200_000


def per_call(fn: Callable[[], Any], n: int = N) -> float:
    """Best of 5 of ``n`` calls, µs per call."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def fixture() -> tuple[CycleWriter, Buckets | None, Callable[[float], None], list[bytes]]:
    out: list[bytes] = []
    transport = types.SimpleNamespace(write=out.append)
    cycle = types.SimpleNamespace(response_started=True, response_complete=False, chunked_encoding=True,
                                  scope={"method": "POST"}, disconnected=False, transport=transport,
                                  flow=types.SimpleNamespace(write_paused=False), keep_alive=True)
    seen = Observation.__new__(Observation)
    seen.record = types.SimpleNamespace(output_tokens=-1)  # type: ignore[assignment]
    seen.events = 0
    hist = Histogram("itl", "itl", ["path"], registry=CollectorRegistry(),
                     buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0))
    child = hist.labels("/v1/chat/completions")
    return CycleWriter(cycle, seen), fast_buckets(child), fast_observe(child), out


async def upstream() -> float:
    """µs per socket read of one chunked SSE event through the connection's callbacks to a no-op sink."""
    conn = Connection(types.SimpleNamespace(release=lambda c: None, forget=lambda c: None), ("h", 1, False))
    conn._headers = asyncio.get_running_loop().create_future()
    body = conn.body = BodyReader(conn)
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    body._sink = lambda chunk: True
    framed = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
    return per_call(lambda: conn.data_received(framed))


def main() -> None:
    rows: list[tuple[str, float]] = [("upstream: data_received .. flush (no-op sink)", asyncio.run(upstream()))]
    writer, _, observe, out = fixture()
    tally = StreamTally()
    tally.feed(EVENT)
    last = time.perf_counter()
    ended = False

    def take(chunk: bytes) -> bool:  # the relay's take(), as in SseRelay.__call__
        nonlocal last, ended
        now = time.perf_counter()
        observe(now - last)
        last = now
        tally.feed(chunk)
        ended = tally.done
        return ended

    def sink(chunk: bytes) -> bool:  # the relay's Python sink
        if ended:
            return True
        return writer.write(chunk, not take(chunk))

    rows += [
        ("relay sink, Python (all below)", per_call(lambda: (sink(EVENT), out.clear()))),
        ("  perf_counter + histogram observe", per_call(lambda: observe(time.perf_counter() - last))),
        ("  StreamTally.feed", per_call(lambda: tally.feed(EVENT))),
        ("  CycleWriter.write (Observation.body, framing, write)", per_call(lambda: (writer.write(EVENT, True),
                                                                                   out.clear()))),
        ("    Observation.body", per_call(lambda: writer._observation.body(EVENT))),  # type: ignore[union-attr]
    ]
    c_writer, buckets, _, c_out = fixture()
    c_tally = StreamTally()
    c_tally.feed(EVENT)
    spliced = c_writer.splice(c_tally, time.perf_counter(), lambda chunk: True, buckets)
    if spliced is not None:
        take_c = spliced.take
        rows.append(("ChunkSink.take (C, the gap into the bucket counts)", per_call(lambda: (take_c(EVENT),
                                                                                           c_out.clear()))))
        fold = buckets.add if buckets is not None else None
        counts, total = spliced.buckets()
        if fold is not None:
            rows.append(("  the end's fold into the histogram, per stream", per_call(lambda: fold(counts, total))))
    print(f"per chunk, one {len(EVENT)}-byte SSE event, µs (best of 5 x {N})")
    for name, us in rows:
        print(f"{name:58s} {us:6.2f}")


if __name__ == "__main__":
    main()
