"""The frontend's data path before and after, side by side: infera at git ``--ref`` vs this tree.

Two mock engines at a huge speedup (engine time negligible); two round-robin frontends over them,
one running the infera package of ``--ref`` (exported to a temp dir and put first on its path),
one running this tree; round-robin so the prompt stage is out of the picture and what is left is
intake, dispatch, the engine call and the relay. ~1k-token chat prompts; non-streamed
``max_tokens`` 8, streamed ``max_tokens`` 64 (64 SSE events from the engine). Each round runs
every cell on both frontends, the order alternating; CPU = each frontend's utime+stime over the
cell / its requests; figures are medians over rounds.

    .venv/bin/python bench/relay_ab.py --ref 2d3553e      # ~4 min
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    PYTHON,
    Proc,
    chat_body,
    default_tokenizer_dir,
    export_ref,
    frontend_ready,
    machine_info,
    make_session,
    median,
    mock_engine,
    percentile,
    run_load,
    stop_all,
    write_results,
)
from harness import free_port, frontend_argv

MODEL = "bench-model"
CELLS = [(False, 1), (True, 1), (False, 16), (True, 16)]  # (stream, concurrency)


def _front(name: str, engines: list[Proc], log_dir: Path, root: Path | None, policy: str, tok: Path) -> Proc:
    port = free_port()
    argv = frontend_argv(port, [e.url for e in engines], policy=policy, python=PYTHON,
                         tokenizer=tok if policy != "round-robin" else "",
                         args=("--log-level", "warning"))
    if root is not None:  # run the exported package: first on sys.path, ahead of the working tree
        argv = [PYTHON, "-c", f"import sys, runpy; sys.path.insert(0, {str(root)!r}); "
                "sys.argv[0] = 'infera.server'; runpy.run_module('infera.server', run_name='__main__')",
                *argv[3:]]
    return Proc(name, argv, port, log_dir / f"{name}.log")


async def _cell(front: Proc, bodies: list[bytes], conc: int, n: int, offset: int) -> dict[str, float]:
    async with make_session(conc) as session:
        url = [front.url + "/v1/chat/completions"]
        await run_load(session, url, bodies, conc, 50, 60.0, offset=offset)  # warm the connections
        cpu0 = front.cpu()
        res = await run_load(session, url, bodies, conc, n, 120.0, offset=offset + 100)
        cpu = front.cpu() - cpu0
    if res.errors:
        raise RuntimeError(f"{front.name}: {res.errors} errors: {res.first_error}")
    return {"cpu_us": cpu / max(res.ok, 1) * 1e6, "p50_ms": percentile(res.latencies, 50) * 1e3, "rps": res.rps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="git ref of the 'before' frontend")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=600, help="measured requests per cell")
    ap.add_argument("--policy", default="round-robin", help="both frontends' --router-policy (kv-aware: with the "
                    "prompt stage, the index and the mocks' KV events)")
    ap.add_argument("--ref-ext", default=None, help="a directory holding a C extension for the ref to run instead "
                    "of the one built from its own csrc/ (e.g. /work/main/infera/kv)")
    args = ap.parse_args()
    tok = default_tokenizer_dir()
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-relay-ab-"))
    base = export_ref(args.ref, log_dir / "base")  # with its own C extensions
    for ext in Path(args.ref_ext).glob("_native*.so") if args.ref_ext else ():
        shutil.copy(ext, base / "infera" / "kv" / ext.name)
    bodies = {s: [chat_body(i, MODEL, s, 64 if s else 8) for i in range(400)] for s in (False, True)}
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir) for i in range(2)]
    fronts = {"before": _front("before", engines, log_dir, base, args.policy, tok),
              "after": _front("after", engines, log_dir, None, args.policy, tok)}
    out: dict[str, dict[str, list[dict[str, float]]]] = {k: {} for k in fronts}
    try:
        for p in engines:
            p.start()
        for p in engines:
            p.wait_ready("/infera/worker", 60)
        for f in fronts.values():
            f.start()
        for f in fronts.values():
            f.wait_ready("/health", 90, frontend_ready(len(engines)))
        for r in range(args.rounds):
            order = list(fronts) if r % 2 == 0 else list(reversed(fronts))
            for stream, conc in CELLS:
                cell = f"{'stream' if stream else 'non-stream'} c={conc}"
                for name in order:
                    m = asyncio.run(_cell(fronts[name], bodies[stream], conc, args.n, r * 1000))
                    out[name].setdefault(cell, []).append(m)
                    print(f"round {r} {cell:<16} {name:<7} {m['cpu_us']:>6.0f} µs/req  p50 {m['p50_ms']:.2f} ms  "
                          f"{m['rps']:.0f} req/s", flush=True)
    finally:
        stop_all([*fronts.values(), *engines])
    print("\n| cell | CPU µs/req before | after | after/before | p50 ms before | after | req/s before | after |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    summary: dict[str, Any] = {}
    for stream, conc in CELLS:
        cell = f"{'stream' if stream else 'non-stream'} c={conc}"
        b = {k: median([m[k] for m in out["before"][cell]]) for k in ("cpu_us", "p50_ms", "rps")}
        a = {k: median([m[k] for m in out["after"][cell]]) for k in ("cpu_us", "p50_ms", "rps")}
        summary[cell] = {"before": b, "after": a}
        print(f"| {cell} | {b['cpu_us']:.0f} | {a['cpu_us']:.0f} | {a['cpu_us'] / b['cpu_us']:.2f}× | "
              f"{b['p50_ms']:.2f} | {a['p50_ms']:.2f} | {b['rps']:.0f} | {a['rps']:.0f} |")
    res = {"machine": machine_info(), "args": vars(args), "rounds": out, "summary": summary,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(f"results: {write_results('relay_ab', res)}")


if __name__ == "__main__":
    main()
