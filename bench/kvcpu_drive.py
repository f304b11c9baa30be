"""Prompt-stage CPU of the bench workloads in process (issue 15, helper kvcpu).

Render + tokenize (``PromptRenderer.chat_token_ids`` with its prompt cache) of bench/workloads.py's
quick workloads with the Qwen tokenizer: the burst (does request 2..40 reuse the shared prefix?),
tenants, multiturn and agentic medians; then json parse and from-scratch block hashing per request.

    PYTHONPATH=$PWD .venv/bin/python bench/kvcpu_drive.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads

from infera.kv.hashing import block_hashes
from infera.kv.tokenizer import PromptRenderer


def main() -> None:
    r = PromptRenderer.from_dir(Path(__file__).resolve().parent.parent / ".cache" / "qwen-tokenizer")
    wl = {w.name: w for w in workloads.build(True, 64, 8.0)}

    def run(w: workloads.Workload, idx: list[int]) -> list[float]:
        ts = []
        for i in idx:
            t = time.perf_counter()
            r.chat_token_ids(list(w.messages[i]))
            ts.append((time.perf_counter() - t) * 1e3)
        return ts

    b = wl["burst"]
    nb = b.params["background"]
    burst = list(range(nb, nb + 40))
    ts = run(b, burst)
    n_tokens = len(r.chat_token_ids(list(b.messages[nb])))
    print(f"burst: req1 {ts[0]:.2f} ms, req2..40 median {sorted(ts[1:])[19]:.2f} ms, tokens {n_tokens}")
    cache = r.prompt_cache
    print("cache", {k: getattr(cache, k, None) for k in ("hits", "reused_tokens", "encoded_tokens")})
    for name in ("tenants", "multiturn", "agentic"):
        w = wl[name]
        ts = sorted(run(w, [i for s in w.sessions for i in s][:200]))
        print(f"{name} n={len(ts)} median {ts[len(ts) // 2]:.2f} ms p90 {ts[int(len(ts) * 0.9)]:.2f}")
    tenants = [i for s in wl["tenants"].sessions for i in s][:200]
    for name, idxs in (("burst", burst), ("tenants", tenants)):
        w = wl[name]
        tj = tr = th = 0.0
        for i in idxs:
            t0 = time.perf_counter()
            payload = json.loads(w.body(i, "m"))
            t1 = time.perf_counter()
            ids = r.chat_token_ids(payload["messages"])
            t2 = time.perf_counter()
            block_hashes(ids, 16)
            t3 = time.perf_counter()
            tj, tr, th = tj + t1 - t0, tr + t2 - t1, th + t3 - t2
        k = 1e3 / len(idxs)
        print(f"{name} per req ms: json {tj * k:.3f} prompt {tr * k:.3f} hash(from scratch) {th * k:.3f}")


if __name__ == "__main__":
    main()
