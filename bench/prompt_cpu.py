"""The context stage's CPU per request on a long conversation's next turn, by part, in process: a git ref vs this tree.

bench/prompt_sweep.py's conversations (a ~500-token system prompt, then ~150-token turns, as many as the target
length needs), ``SESSIONS`` of them: per repeat both caches are cleared, each session's previous turn is routed
(untimed), then its next turn is timed in three parts, as the kv-aware router runs them: *render* (the chat
template, through the render cache), *encode* (the prompt cache: the reused prefix's ids plus the new turn's
tokens), *hash* (the routing context built from the ids and its block hashes, block 16: ``ctx.hashes(16)``). CPU
time of this process (``process_time``) with the cyclic GC off in the timed loop (the GC's share is kv_stages.py's
``gc`` column); medians over repeats. Trees run in alternating subprocesses (``--ref``: ``git archive REF infera``
with this tree's C extension), so both see the same load; read the ratio per round.

    .venv/bin/python bench/prompt_cpu.py --ref main --rounds 3 --lengths 4000,16000
    .venv/bin/python bench/prompt_cpu.py --ref main --fresh   # the new turn tokenized in every repeat (the codec's
                                                              # segment cache cleared too; see --help)
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
from pathlib import Path
from typing import Any

PARTS = ("render", "encode", "hash")
SESSIONS = 12


def measure(target: int, repeats: int, fresh: bool = False) -> dict[str, Any]:
    """µs per request of each part at ``target`` tokens, with this process's ``infera``."""
    from bench.common import default_tokenizer_dir
    from bench.prompt_sweep import _session, _turns_for
    from infera.kv.hashing import block_hashes
    from infera.kv.tokenizer import PromptRenderer
    from infera.router.context import ContextBuilder, RouteRequest

    renderer = PromptRenderer.from_dir(default_tokenizer_dir())
    turns = _turns_for(renderer, target)
    pairs = [(_session(s, turns - 1), _session(s, turns)) for s in range(SESSIONS)]
    cache = renderer.prompt_cache
    assert cache is not None
    clock = time.process_time_ns
    req = RouteRequest(kind="chat", path="/v1/chat/completions", body=b"{}", payload={}, model="m", max_tokens=8)
    # the ids as the router's context takes them (a tree before ArrayIds: the list)
    encode = getattr(renderer, "encode_chat_ids", renderer.encode_chat)
    per: dict[str, list[float]] = {p: [] for p in PARTS}
    for _ in range(repeats):
        cache.clear()
        for rc in renderer.render_caches.values():
            rc.clear()
        segments = getattr(getattr(renderer, "_codec", None), "_segments", None)
        if fresh and segments is not None:  # the new turn's text not seen by the codec's segment cache either
            segments.clear()
        for prev, _cur in pairs:
            block_hashes(renderer.chat_token_ids(prev), 16)
        gc.collect()
        gc.disable()
        spent = dict.fromkeys(PARTS, 0)
        for _prev, cur in pairs:
            t0 = clock()
            text = renderer.render_chat(cur)
            t1 = clock()
            ids = encode(text)
            t2 = clock()
            ContextBuilder._context(req, ids).hashes(16)
            t3 = clock()
            spent["render"] += t1 - t0
            spent["encode"] += t2 - t1
            spent["hash"] += t3 - t2
        gc.enable()
        for p in PARTS:
            per[p].append(spent[p] / len(pairs) / 1e3)
    tokens = len(renderer.chat_token_ids(pairs[0][1]))
    return {"tokens": tokens, "turns": turns, **{p: statistics.median(v) for p, v in per.items()}}


def _child(root: str, target: int, repeats: int, fresh: bool) -> dict[str, Any]:
    repo = str(Path(__file__).resolve().parent.parent)
    code = (f"import sys, json; sys.path.insert(0, {root!r}); sys.path.insert(1, {repo!r}); "
            f"import bench.prompt_cpu as p; print(json.dumps(p.measure({target}, {repeats}, {fresh})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="", help="git ref to compare with (its infera/, this tree's C extension)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lengths", default="4000,16000", help="target prompt tokens, comma-separated")
    ap.add_argument("--fresh", action="store_true",
                    help="clear the codec's segment cache too, so the new turn is tokenized in every repeat (without "
                         "it only the first repeat tokenizes it: the median times a segment-cache hit)")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    trees = {"this tree": str(repo)}
    tmp = None
    if args.ref:
        from bench.common import export_ref

        tmp = export_ref(args.ref, Path(tempfile.mkdtemp(prefix="prompt-cpu-")))  # with its own C extensions
        trees = {args.ref: str(tmp), "this tree": str(repo)}
    lengths = [int(x) for x in args.lengths.split(",")]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(t, n): [] for t in trees for n in lengths}
    try:
        for r in range(args.rounds):
            for n in lengths:
                for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
                    got = _child(trees[name], n, args.repeats, args.fresh)
                    runs[(name, n)].append(got)
                    print(f"round {r} {n} {name}: " + ", ".join(f"{p} {got[p]:.1f}" for p in PARTS), flush=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n| prompt tokens | tree | " + " | ".join(PARTS) + " | total | per round |")
    print("|--:|---|" + "--:|" * (len(PARTS) + 1) + "---|")
    for n in lengths:
        for name in trees:
            cells = runs[(name, n)]
            totals = [sum(c[p] for p in PARTS) for c in cells]
            med = " | ".join(f"{statistics.median(c[p] for c in cells):.1f}" for p in PARTS)
            print(f"| {cells[0]['tokens']} | {name} | {med} | **{statistics.median(totals):.0f}** | "
                  + " / ".join(f"{t:.0f}" for t in totals) + " |")


if __name__ == "__main__":
    main()
