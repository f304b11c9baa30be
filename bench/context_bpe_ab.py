"""kv-aware's context stage as a live frontend meets it, this tree's C BPE table against a ref tree's, request by
request in one process (bench/README.md, "Issue 15, sixteenth round ... ctx18").

quality_cpu_split.py ``--variants whole`` starts a frontend per workload and plays routing_quality's ``tenants`` or
``multiturn`` requests once: the prompt cache sees each prompt for the first time, and a hit's tail is new text (a
unique question, a conversation's last answer and next question, a tenant's whole prompt off another's first cut).
Here two renderers play those requests alike from a cleared prompt cache each round (the first round uncounted):
this tree's, and one whose codec's ``infera.kv._bpe.Bpe`` is the ref tree's build of csrc/bpe.c (the same ranks),
in turns, which goes first alternating per request. Before each timed build, untimed: ``JUNK_MB`` (default 48, over
this box's 32 MB L3) of other memory written, and the body parsed. Timed: ``ContextBuilder.build`` in thread CPU, µs
per counted request; the ids and block hashes of the two asserted equal on every request. ``JUNK_MB=0``: warm.

    PYTHONPATH=$PWD .venv/bin/python bench/context_bpe_ab.py /tmp/ref tenants 3
"""

from __future__ import annotations

import ctypes
import gc
import importlib.machinery
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from bench.common import default_tokenizer_dir
from bench.kv_stages import workload_bodies
from infera.kv.bpe import PATTERN_DIGITS
from infera.kv.codecs import TiktokenCodec
from infera.kv.tokenizer import PromptRenderer
from infera.router.context import ContextBuilder, RouteRequest


def ref_module(ref: Path, name: str) -> Any:
    """The ref tree's built ``infera.kv.<name>`` (``_bpe``, ``_native``) as a module of its own."""
    path = next((ref / "infera/kv").glob(f"{name}.*.so"))
    loader = importlib.machinery.ExtensionFileLoader(f"ref_kv.{name}", str(path))
    spec = importlib.util.spec_from_loader(f"ref_kv.{name}", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _ref_renderer(ref: Path) -> PromptRenderer:
    """A renderer whose codec encodes through the ref tree's C table (built from the same ranks)."""
    r = PromptRenderer.from_dir(default_tokenizer_dir())
    codec = next(v for v in vars(r).values() if isinstance(v, TiktokenCodec))
    enc = codec._enc
    table = ref_module(ref, "_bpe").Bpe(enc._mergeable_ranks, PATTERN_DIGITS[enc._pat_str], enc.encode_ordinary)
    codec._table = table
    codec._ordinary = table.encode
    codec._packed = table.encode_chat
    return r


def main(ref: Path, workload: str, rounds: int) -> None:
    compare(_ref_renderer(ref), workload, rounds)


def compare(ref_renderer: PromptRenderer, workload: str, rounds: int, ref_builder: Any = ContextBuilder) -> None:
    """``ref_renderer`` against this tree's renderer on ``workload``'s requests, ``rounds`` counted rounds (the
    module docstring says how); ``ref_builder``: the ref's ``ContextBuilder`` class (default: this tree's)."""
    trees: dict[str, PromptRenderer] = {"ref": ref_renderer, "this": PromptRenderer.from_dir(default_tokenizer_dir())}
    builders = {k: (ref_builder if k == "ref" else ContextBuilder)(r, True) for k, r in trees.items()}
    bodies, _, _, max_tokens = workload_bodies(workload)
    junk = bytearray(int(os.environ.get("JUNK_MB", "48")) << 20)
    where = ctypes.addressof((ctypes.c_char * len(junk)).from_buffer(junk)) if junk else 0
    gc.freeze()
    gc.set_threshold(5000, 10, 10)
    clock = time.thread_time_ns
    total = dict.fromkeys(trees, 0)
    n = 0
    for r in range(rounds + 1):
        for renderer in trees.values():
            cache = renderer.prompt_cache
            assert cache is not None
            cache.clear()
        for i, body in enumerate(bodies):
            order = ("ref", "this") if (i + r) % 2 else ("this", "ref")
            got = []
            for name in order:
                if junk:
                    ctypes.memset(where, (n + len(got)) & 0xFF, len(junk))  # every line written, no Python loop
                req = RouteRequest(kind="chat", path="/v1/chat/completions", body=body, payload=orjson.loads(body),
                                   model="m", max_tokens=max_tokens)
                t0 = clock()
                ctx = builders[name].build(req)
                d = clock() - t0
                got.append((list(ctx.token_ids or []), ctx.hashes(16)))
                if r:
                    total[name] += d
            assert got[0] == got[1], "the trees' ids or block hashes differ"
            n += r > 0
    mine, theirs = total["this"] / n / 1e3, total["ref"] / n / 1e3
    print(f"{workload}: ref {theirs:.1f} µs, this {mine:.1f} µs, this / ref {mine / theirs:.3f} ({n} requests each,"
          f" JUNK_MB {len(junk) >> 20})", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "tenants",
         int(sys.argv[3]) if len(sys.argv) > 3 else 2)
