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

    PYTHONPATH=$PWD .venv/bin/python bench/context_native_ab.py /tmp/ref tenants 3
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import default_tokenizer_dir
from bench.context_bpe_ab import compare, ref_module
from infera.kv.tokenizer import PromptRenderer


def _ref_renderer(ref: Path) -> PromptRenderer:
    """A renderer whose prompt cache calls the ref tree's C (the same codec and table as this tree's)."""
    r = PromptRenderer.from_dir(default_tokenizer_dir())
    cache = r.prompt_cache
    assert cache is not None and cache._native is not None
    cache._native = ref_module(ref, "_native")
    return r


def main(ref: Path, workload: str, rounds: int) -> None:
    compare(_ref_renderer(ref), workload, rounds)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "tenants",
         int(sys.argv[3]) if len(sys.argv) > 3 else 2)
