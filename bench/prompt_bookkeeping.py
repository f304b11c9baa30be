"""The prompt cache's own CPU per fresh turn, in process: a git ref vs this tree, in alternating subprocesses.

router_overhead.py's workload (``bench.common.chat_messages``: 16 shared system prompts + history, then a user turn
unique to each request): each request's prompt is rendered (untimed, just before, so its text is as warm as in the
router), then ``PromptCache.encode_within(text, None, listed=False)`` and ``block_hashes(ids, 16)`` run as the
router's context runs them. The codec's own calls (the BPE of the new text) are timed apart: *bookkeeping* is the
rest (the lookup, the ids' array, the cuts and their keys, the store and eviction, the block hashes). CPU time of
the process (``process_time_ns``), µs per request, after a warm-up, gc frozen with the server's young threshold;
the cache is filled first (64 MiB of prompts: how many depends on what the tree keeps a prompt), so every request
also evicts, as in a router that has run a while. Read the ratio per round.

    .venv/bin/python bench/prompt_bookkeeping.py --ref d2ab9af --rounds 5 --n 6000
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

START = 100_000  # request numbers: past any warm-up elsewhere
WARMUP = 2000  # requests past the one that filled the cache
MOST_WARMUP = 100_000


def measure(n: int) -> dict[str, float]:
    """µs per fresh turn with this process's ``infera``: total, tokenizer, bookkeeping, and the young GC's share."""
    from bench.common import chat_messages, default_tokenizer_dir
    from infera.kv.hashing import block_hashes
    from infera.kv.tokenizer import PromptRenderer

    renderer = PromptRenderer.from_dir(default_tokenizer_dir())
    cache = renderer.prompt_cache
    assert cache is not None
    clock = time.process_time_ns
    spent = [0]

    def timed(inner: Callable[[str], list[int]]) -> Callable[[str], list[int]]:
        def call(text: str) -> list[int]:
            t0 = clock()
            out = inner(text)
            spent[0] += clock() - t0
            return out
        return call

    # both codec entries: a tree since the tenth round encodes the text past a reused prefix through ``_encode_tail``
    # (the codec without its segment cache), which must not count as bookkeeping
    cache._encode = timed(cache._encode)  # type: ignore[method-assign]
    if hasattr(cache, "_encode_tail"):
        cache._encode_tail = timed(cache._encode_tail)
    # warm up until the cache is full and evicting (its steady state: how many prompts fill it depends on what it
    # keeps a prompt), then WARMUP more
    i = START
    while cache.size_bytes < cache.max_bytes - (64 << 10) and i < START + MOST_WARMUP:
        block_hashes(cache.encode_within(renderer.render_chat(chat_messages(i)), None, listed=False), 16)
        i += 1
    warm = i - START + WARMUP
    messages = [chat_messages(i) for i in range(i, i + WARMUP + n)]
    for m in messages[:WARMUP]:
        block_hashes(cache.encode_within(renderer.render_chat(m), None, listed=False), 16)
    collected = [0, 0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collected[1] = clock()
        else:
            collected[0] += clock() - collected[1]

    gc.collect()
    gc.freeze()
    gc.set_threshold(5000, 10, 10)
    gc.callbacks.append(on_gc)
    spent[0] = 0
    total = 0
    for m in messages[WARMUP:]:
        text = renderer.render_chat(m)
        t0 = clock()
        block_hashes(cache.encode_within(text, None, listed=False), 16)
        total += clock() - t0
    gc.callbacks.remove(on_gc)
    return {"total": total / n / 1e3, "tokenizer": spent[0] / n / 1e3, "bookkeeping": (total - spent[0]) / n / 1e3,
            "gc": collected[0] / n / 1e3, "hits": cache.hits / (warm + n), "entries": cache.entries}


def _child(root: str, n: int) -> dict[str, float]:
    repo = str(Path(__file__).resolve().parent.parent)
    code = (f"import sys, json; sys.path.insert(0, {root!r}); sys.path.insert(1, {repo!r}); "
            f"import bench.prompt_bookkeeping as p; print(json.dumps(p.measure({n})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="", help="git ref to compare with (its infera/ and its own C extensions)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=6000, help="fresh turns timed per run")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    trees = {"this tree": str(repo)}
    tmp = None
    if args.ref:
        from bench.common import export_ref

        tmp = export_ref(args.ref, Path(tempfile.mkdtemp(prefix="prompt-bookkeeping-")))
        trees = {args.ref: str(tmp), "this tree": str(repo)}
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    parts = ("total", "tokenizer", "bookkeeping", "gc")
    try:
        for r in range(args.rounds):
            for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
                got = _child(trees[name], args.n)
                runs[name].append(got)
                print(f"round {r} {time.strftime('%H:%M:%S', time.gmtime())} {name}: "
                      + ", ".join(f"{p} {got[p]:.2f}" for p in parts), flush=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n| tree | " + " | ".join(parts) + " | bookkeeping per round |")
    print("|---|" + "--:|" * len(parts) + "---|")
    for name, cells in runs.items():
        med = " | ".join(f"{statistics.median(c[p] for c in cells):.1f}" for p in parts)
        print(f"| {name} | {med} | " + " / ".join(f"{c['bookkeeping']:.1f}" for c in cells) + " |")
    if args.ref:
        ratios = [b["bookkeeping"] / a["bookkeeping"] for a, b in zip(runs[args.ref], runs["this tree"], strict=True)]
        print(f"\nbookkeeping, this tree / {args.ref} per round: " + " ".join(f"{x:.2f}x" for x in ratios)
              + f" (median {statistics.median(ratios):.2f}x)")


if __name__ == "__main__":
    main()
