"""Where kv-aware's context stage goes when the process runs cold between requests (bench/README.md, "Issue 15,
seventeenth round ... ctx19").

routing_quality's ``tenants`` or ``multiturn`` requests played through ``ContextBuilder.build`` as a frontend started
for them meets them (bench/context_bpe_ab.py's set-up: the prompt cache cleared each round, the first round
uncounted, the body parsed just before). Three reports:

``split``: thread CPU µs per request of the whole build and, through wrappers (each adds a frame of its own), of the
render, the prompt cache's ``encode_within`` and the context object; ``JUNK_MB`` (default 48, over this box's 32 MB
L3) of other memory written before each request, or none (``JUNK_MB=0``: warm); ``WARM_CODE=1``: after the junk, the
previous request built again (untimed, a hit on its own prompt): the code, the interpreter's and the cache's shared
structures warm, this request's own data (its prompt's stored prefix, ids, hashes) still cold. Only the build's
figure is clean with ``WARM_CODE=1`` (the wrappers also count the untimed build).

``objects``: per request, what the build leaves allocated while its context is alive (tracemalloc, by line: what it
wrote and keeps), and the Python frames and C calls it makes (``sys.setprofile``).

``primitives``: what single steps of a hit cost cold, in isolation (an empty call; a 10.8 KB ``array('I')`` slice,
the stored prefix's ids' copy; a list of 170 ints copied, the known block hashes INCREF'd; the same read; a 10 KB
str's utf-8 encoding; a 10 KB bytes compared), 48 MB written before each.

    PYTHONPATH=$PWD .venv/bin/python bench/context_cold.py split tenants
    WARM_CODE=1 PYTHONPATH=$PWD .venv/bin/python bench/context_cold.py split multiturn
    PYTHONPATH=$PWD .venv/bin/python bench/context_cold.py objects tenants
    PYTHONPATH=$PWD .venv/bin/python bench/context_cold.py primitives
"""

from __future__ import annotations

import collections
import ctypes
import gc
import os
import random
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from bench.common import default_tokenizer_dir
from bench.kv_stages import workload_bodies
from infera.kv.tokenizer import PromptRenderer
from infera.router.context import ContextBuilder, RouteRequest

clock = time.thread_time_ns


def _junk() -> tuple[bytearray, int]:
    junk = bytearray(int(os.environ.get("JUNK_MB", "48")) << 20)
    return junk, ctypes.addressof((ctypes.c_char * len(junk)).from_buffer(junk)) if junk else 0


def _request(body: bytes, max_tokens: int) -> RouteRequest:
    return RouteRequest(kind="chat", path="/v1/chat/completions", body=body, payload=orjson.loads(body), model="m",
                        max_tokens=max_tokens)


def _wrap(obj: Any, name: str, label: str, acc: dict[str, int]) -> None:
    f = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return f(*args, **kwargs)
        finally:
            acc[label] = acc.get(label, 0) + clock() - t0

    setattr(obj, name, timed)


def split(workload: str, rounds: int) -> None:
    renderer = PromptRenderer.from_dir(default_tokenizer_dir())
    cache = renderer.prompt_cache
    assert cache is not None
    builder = ContextBuilder(renderer, True)
    acc: dict[str, int] = {}
    _wrap(renderer, "render_chat", "render", acc)
    _wrap(cache, "encode_within", "prompt cache", acc)
    _wrap(builder, "_context", "context object", acc)
    bodies, _, _, max_tokens = workload_bodies(workload)
    junk, where = _junk()
    warm_code = os.environ.get("WARM_CODE") == "1"
    gc.freeze()
    gc.set_threshold(5000, 10, 10)
    total = n = 0
    for r in range(rounds + 1):
        cache.clear()
        if r == 1:
            acc.clear()
        prev = None
        for body in bodies:
            if junk:
                ctypes.memset(where, n & 0xFF, len(junk))
            if warm_code and prev is not None:
                builder.build(_request(prev, max_tokens))
            req = _request(body, max_tokens)
            t0 = clock()
            ctx = builder.build(req)
            d = clock() - t0
            ctx.hashes(16)
            prev = body
            if r:
                total += d
                n += 1
    pieces = ", ".join(f"{k} {v / n / 1e3:.1f}" for k, v in acc.items())
    print(f"{workload} JUNK_MB={len(junk) >> 20} WARM_CODE={int(warm_code)}: build {total / n / 1e3:.1f} µs a request"
          f" ({n} requests; wrapped: {pieces})", flush=True)


def objects(workload: str, count: int) -> None:
    renderer = PromptRenderer.from_dir(default_tokenizer_dir())
    cache = renderer.prompt_cache
    assert cache is not None
    builder = ContextBuilder(renderer, True)
    bodies, _, _, max_tokens = workload_bodies(workload)
    for body in bodies[:5]:
        builder.build(_request(body, max_tokens)).hashes(16)
    cache.clear()
    gc.disable()
    kept: list[Any] = []
    blocks: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls["py " + frame.f_code.co_qualname] += 1
        elif event == "c_call":
            calls["c " + getattr(arg, "__qualname__", str(arg))] += 1

    for body in bodies[:count]:
        req = _request(body, max_tokens)
        sys.setprofile(profile)
        builder.build(req)
        sys.setprofile(None)
    cache.clear()
    tracemalloc.start(1)
    for body in bodies[:count]:
        req = _request(body, max_tokens)
        before = tracemalloc.take_snapshot()
        ctx = builder.build(req)
        ctx.hashes(16)
        after = tracemalloc.take_snapshot()
        for stat in after.compare_to(before, "lineno"):
            if stat.count_diff > 0:
                frame = stat.traceback[0]
                where = f"{Path(frame.filename).name}:{frame.lineno}"
                blocks[where] += stat.count_diff
                sizes[where] += stat.size_diff
        kept.append(ctx)
    tracemalloc.stop()
    n = min(count, len(bodies))
    py = sum(v for k, v in calls.items() if k.startswith("py "))
    c = sum(v for k, v in calls.items() if k.startswith("c "))
    print(f"{workload}: {n} requests; {py / n:.1f} Python frames and {c / n:.1f} C calls a request; kept while the "
          f"context lives: {sum(blocks.values()) / n:.1f} blocks, {sum(sizes.values()) / n:.0f} bytes a request")
    for where, b in blocks.most_common(12):
        print(f"  {where:32s} {b / n:7.1f} blocks {sizes[where] / n:9.0f} B")
    for name, k in calls.most_common(12):
        print(f"  {k / n:6.2f} {name}")


def primitives(count: int) -> None:
    junk, where = _junk()
    arrays = [array("I", range(i, i + 2700)) for i in range(count)]
    lists = [[random.getrandbits(63) for _ in range(170)] for _ in range(count)]
    texts = [f"x{i} " * 2500 for i in range(count)]
    datas = [t.encode() for t in texts]
    steps: dict[str, Callable[[int], object]] = {
        "an empty call": lambda i: None,
        "array('I') of 2700 ids sliced (10.8 KB copied)": lambda i: arrays[i][:2700],
        "a list of 170 ints copied (170 INCREFs)": lambda i: lists[i].copy(),
        "a list of 170 ints summed (read)": lambda i: sum(lists[i]),
        "a 10 KB str utf-8 encoded": lambda i: texts[i].encode(),
        "a 10 KB bytes compared with a copy": lambda i: datas[i] == bytes(datas[i]),
    }
    for name, step in steps.items():
        total = 0
        for i in range(count):
            if junk:
                ctypes.memset(where, i & 0xFF, len(junk))
            t0 = clock()
            step(i)
            total += clock() - t0
        print(f"  {name:50s} {total / count / 1e3:6.2f} µs (JUNK_MB {len(junk) >> 20})", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "split"
    if what == "split":
        split(sys.argv[2] if len(sys.argv) > 2 else "tenants", int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    elif what == "objects":
        objects(sys.argv[2] if len(sys.argv) > 2 else "tenants", int(sys.argv[3]) if len(sys.argv) > 3 else 80)
    elif what == "primitives":
        primitives(int(sys.argv[2]) if len(sys.argv) > 2 else 400)
    else:
        raise SystemExit("split | objects | primitives")
