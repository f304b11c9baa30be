"""A chat's fresh user turn encoded: tiktoken (the ref's only encoder, and the fallback) vs infera.kv._bpe (csrc/bpe.c).

router_overhead.py's workload (``bench.common.chat_messages``, ~1k-token chats): the unique user turns the Qwen
codec encodes (~940 characters, ~135 tokens; its segment cache has not seen them) are collected, then encoded by
each encoder in interleaved rounds (tiktoken's ``encode_ordinary``, then the C encoder, then again): µs per turn
and ns per token; the same turns with two curly apostrophes and an emoji (C between them, tiktoken around them);
and the whole prompt through the codec (``TiktokenCodec.encode``: the system prompt and history from the segment
cache, the turn encoded) with each encoder. CPU time (``process_time``). Same ids checked on every turn.

    .venv/bin/python bench/bpe_tail.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import chat_messages, default_tokenizer_dir, machine_info


def per_call_us(fn: Callable[[str], Any], texts: list[str], repeats: int) -> float:
    t0 = time.process_time_ns()
    for _ in range(repeats):
        for text in texts:
            fn(text)
    return (time.process_time_ns() - t0) / (repeats * len(texts)) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=1000, help="requests (one fresh turn each)")
    ap.add_argument("--repeats", type=int, default=5, help="passes over the turns per round and encoder")
    args = ap.parse_args()

    from infera.kv.native import ENV
    from infera.kv.tokenizer import PromptRenderer

    fast = PromptRenderer.from_dir(default_tokenizer_dir())
    os.environ[ENV] = "1"  # the same codec with tiktoken as its segment encoder, as at d2ab9af
    old = PromptRenderer.from_dir(default_tokenizer_dir())
    del os.environ[ENV]
    codec_new: Any = fast._codec
    codec_old: Any = old._codec
    assert codec_new._ordinary is not codec_old._ordinary, "infera.kv._bpe is not built, or the pattern is unknown"
    prompts = [fast.render_chat(chat_messages(i)) for i in range(args.n)]

    seen: list[str] = []
    spy_of = codec_old._ordinary
    codec_old._ordinary = lambda text: (seen.append(text), spy_of(text))[1]
    for prompt in prompts:
        codec_old.encode(prompt, False)
    codec_old._ordinary = spy_of
    turns = [t for t in seen if t.startswith("user\nTicket ")]
    tokens = statistics.mean(len(spy_of(t)) for t in turns)
    assert all(codec_new._ordinary(t) == spy_of(t) for t in turns)
    print(f"{len(turns)} fresh turns, {statistics.mean(map(len, turns)):.0f} chars and {tokens:.1f} tokens each; "
          f"load {machine_info()['loadavg_at_start']} at {time.strftime('%H:%M:%S', time.gmtime())} UTC")

    # the same turns with a few non-ASCII characters (curly apostrophes, an emoji): C between them, tiktoken around
    mixed = [t.replace(" the ", " the\u2019s ", 2) + " \U0001f642" for t in turns]
    assert all(codec_new._ordinary(t) == spy_of(t) for t in mixed)
    rows: dict[str, list[float]] = {"turn tiktoken": [], "turn C": [], "prompt tiktoken": [], "prompt C": [],
                                    "mixed tiktoken": [], "mixed C": []}
    for r in range(args.rounds):
        rows["turn tiktoken"].append(per_call_us(spy_of, turns, args.repeats))
        rows["turn C"].append(per_call_us(codec_new._ordinary, turns, args.repeats))
        rows["mixed tiktoken"].append(per_call_us(spy_of, mixed, args.repeats))
        rows["mixed C"].append(per_call_us(codec_new._ordinary, mixed, args.repeats))
        for name, codec in (("prompt tiktoken", codec_old), ("prompt C", codec_new)):
            codec._segments.clear()  # per round: the first pass fills the shared segments, the turns stay fresh
            for prompt in prompts[:16]:
                codec.encode(prompt, False)
            t0 = time.process_time_ns()
            for prompt in prompts[16:]:
                codec.encode(prompt, False)
                codec._segments.popitem(last=True)  # the fresh turn stays fresh in the next pass
            rows[name].append((time.process_time_ns() - t0) / (len(prompts) - 16) / 1000)
        print(f"round {r + 1}: turn {rows['turn tiktoken'][-1]:.2f} -> {rows['turn C'][-1]:.2f} µs "
              f"({rows['turn tiktoken'][-1] / rows['turn C'][-1]:.2f}x); prompt {rows['prompt tiktoken'][-1]:.2f} -> "
              f"{rows['prompt C'][-1]:.2f} µs ({rows['prompt tiktoken'][-1] / rows['prompt C'][-1]:.2f}x)")
    print("\n| encoder | turn µs (median) | ns/token | whole prompt µs (median) | turn with 3 non-ASCII chars µs |")
    print("|---|---:|---:|---:|---:|")
    for name in ("tiktoken", "C"):
        turn, prompt = statistics.median(rows[f"turn {name}"]), statistics.median(rows[f"prompt {name}"])
        print(f"| {name} | {turn:.2f} | {turn * 1000 / tokens:.0f} | {prompt:.2f} | "
              f"{statistics.median(rows[f'mixed {name}']):.2f} |")


if __name__ == "__main__":
    main()
