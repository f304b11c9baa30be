"""The tails a live frontend's prompt-cache hits encode, and what they cost: this tree's C BPE against tiktoken
(bench/README.md, "Issue 15, sixteenth round ... ctx18").

routing_quality's ``tenants`` or ``multiturn`` requests played once over a fresh prompt cache, as
quality_cpu_split.py ``--variants whole`` plays them to a frontend started for them (``PASS=1``: a second time,
every prompt seen); each hit's tail (the text past its cut, what ``encode_tail_packed`` is given) is collected. Then
per tail, in turns: the codec's packed fresh encoder (csrc/bpe.c's ``encode_chat``, through the codec's Python
method) and tiktoken's ``encode`` (specials allowed, the same ids: asserted), µs per tail, ns per token and per
byte, thread CPU; warm (a tight loop) and cold (``JUNK_MB``, default 48, of other memory written before each).

    PYTHONPATH=$PWD .venv/bin/python bench/context_tails.py tenants
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from bench.common import default_tokenizer_dir
from bench.kv_stages import workload_bodies
from infera.kv.codecs import TiktokenCodec
from infera.kv.tokenizer import PromptRenderer
from infera.router.context import ContextBuilder, RouteRequest


def main(workload: str, rounds: int) -> None:
    renderer = PromptRenderer.from_dir(default_tokenizer_dir())
    cache = renderer.prompt_cache
    codec = next(v for v in vars(renderer).values() if isinstance(v, TiktokenCodec))
    packer = codec.fresh_packer
    assert cache is not None and packer is not None
    tails: list[str] = []

    def spy(text: str) -> bytes:
        tails.append(text)
        return packer(text)

    cache._encode_packed = spy
    bodies, _, _, max_tokens = workload_bodies(workload)
    builder = ContextBuilder(renderer, True)
    for _ in range(int(os.environ.get("PASS", "0")) + 1):
        tails.clear()
        for body in bodies:
            builder.build(RouteRequest(kind="chat", path="/v1/chat/completions", body=body,
                                       payload=orjson.loads(body), model="m", max_tokens=max_tokens))
    cache._encode_packed = packer
    enc = codec._enc
    for t in tails:
        assert array("I", packer(t)).tolist() == enc.encode(t, allowed_special="all")
    tokens = [len(packer(t)) // 4 for t in tails]
    sizes = [len(t.encode()) for t in tails]
    q = statistics.quantiles(tokens, n=10)
    print(f"{workload}: {len(tails)} hits of {len(bodies)} requests; tail tokens mean {statistics.mean(tokens):.0f},"
          f" p10 / p50 / p90 {q[0]:.0f} / {statistics.median(tokens):.0f} / {q[-1]:.0f}, max {max(tokens)};"
          f" bytes mean {statistics.mean(sizes):.0f}; ASCII {sum(t.isascii() for t in tails)}")
    junk = bytearray(int(os.environ.get("JUNK_MB", "48")) << 20)
    where = ctypes.addressof((ctypes.c_char * len(junk)).from_buffer(junk)) if junk else 0
    clock = time.thread_time_ns
    coders = {"C (packed)": packer, "tiktoken": lambda t: enc.encode(t, allowed_special="all")}
    for cold in (False, True):
        if cold and not junk:
            break
        total = dict.fromkeys(coders, 0)
        k = 0
        for _ in range(rounds):
            for i, t in enumerate(tails):
                for name in sorted(coders, reverse=bool(i % 2)):
                    if cold:
                        ctypes.memset(where, k & 0xFF, len(junk))
                        k += 1
                    t0 = clock()
                    coders[name](t)
                    total[name] += clock() - t0
        n, toks, size = rounds * len(tails), rounds * sum(tokens), rounds * sum(sizes)
        print(f"  {'cold' if cold else 'warm'}: " + "; ".join(
            f"{name} {v / n / 1e3:.1f} µs a tail, {v / toks:.0f} ns a token, {v / size:.1f} ns a byte"
            for name, v in total.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tenants", int(sys.argv[2]) if len(sys.argv) > 2 else 3)
