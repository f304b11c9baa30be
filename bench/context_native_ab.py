"""kv-aware's context stage as a live frontend meets it, this tree's ``infera.kv._native`` (the prompt cache's C)
against a ref tree's, request by request in one process (bench/README.md, "Issue 15, seventeenth round ... ctx19";
bench/context_bpe_ab.py's harness, ``compare``, the other C module swapped).

quality_cpu_split.py ``--variants whole`` starts a frontend per workload and plays routing_quality's ``tenants`` or
``multiturn`` requests once: the prompt cache sees each prompt for the first time, and a hit's tail is new text (a
unique question, a conversation's last answer and next question, a tenant's whole prompt off another's first cut).
Here two renderers play those requests alike from a cleared prompt cache each round (the first round uncounted):
this tree's, and one whose prompt cache calls the ref tree's build of ``infera.kv._native`` (csrc/prompt_cache.c),
in turns, which goes first alternating per request. Before each timed build, untimed: ``JUNK_MB`` (default 48, over
this box's 32 MB L3) of other memory written, and the body parsed. Timed: ``ContextBuilder.build`` in thread CPU, µs
per counted request; the ids and block hashes of the two asserted equal on every request. ``JUNK_MB=0``: warm.
``REF_PY=1``: the ref's prompt cache is also the ref tree's ``infera/kv/prompt_cache.py`` (its Python around the C
calls; loaded as a module of its own, built with this tree's codec, table and arguments), and its context builder the
ref tree's ``infera/router/context.py``'s: a change to the C and the Python around it A/B'd. The harness is not
symmetric (an A/A, this tree as its own ref, reads 0.86-0.98): run it both ways (from the ref tree with this tree as
its ref too) and read the geometric mean of this / ref and 1 / (the other way's).

    PYTHONPATH=$PWD .venv/bin/python bench/context_native_ab.py /tmp/ref tenants 3
    REF_PY=1 PYTHONPATH=$PWD .venv/bin/python bench/context_native_ab.py /tmp/ref multiturn 3
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import default_tokenizer_dir
from bench.context_bpe_ab import compare, ref_module
from infera.kv.tokenizer import PromptRenderer


def _module(ref: Path, rel: str) -> Any:
    """The ref tree's Python module at ``rel`` as a module of its own (importing this tree's others)."""
    spec = importlib.util.spec_from_file_location("ref_kv." + Path(rel).stem, ref / rel)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _ref_renderer(ref: Path) -> PromptRenderer:
    """A renderer whose prompt cache calls the ref tree's C (the same codec and table as this tree's)."""
    r = PromptRenderer.from_dir(default_tokenizer_dir())
    cache = r.prompt_cache
    assert cache is not None and cache._native is not None
    native = ref_module(ref, "_native")
    if os.environ.get("REF_PY") == "1":
        mod = _module(ref, "infera/kv/prompt_cache.py")
        boundaries = {t.decode("utf-8"): i for t, i in cache._id_of.items()}
        cache = mod.PromptCache(cache._encode, boundaries, cache.max_bytes, len(cache._ints), True,
                                encode_tail=cache._encode_tail, encode_tail_packed=cache._encode_packed)
        r._prompts = cache
    cache._native = native
    return r


def main(ref: Path, workload: str, rounds: int) -> None:
    if os.environ.get("REF_PY") == "1":
        compare(_ref_renderer(ref), workload, rounds, _module(ref, "infera/router/context.py").ContextBuilder)
    else:
        compare(_ref_renderer(ref), workload, rounds)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "tenants",
         int(sys.argv[3]) if len(sys.argv) > 3 else 2)
