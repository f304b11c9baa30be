"""Does the router's view of each cache match the engine's? Sampled live while a workload runs.

Starts N mock engines and one infera frontend, plays a bench workload (default: agentic) and,
every ``--every`` seconds, reads each engine's cached blocks (``GET /infera/kv_cache``, the engine's own
pool) and the router's indexed blocks for it (``GET /v1/workers``: ``kv_blocks_indexed``,
confirmed blocks from KV events only). Reports how far apart they were during the run (the
event lag: blocks stored or evicted that the router has not applied yet) and after it settled
(they must be equal: nothing lost, nothing stale), plus the decisions by reason.

    .venv/bin/python bench/kv_view_check.py --policy kv-aware-blocks --speedup 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workloads
from bench.common import default_tokenizer_dir, frontend, frontend_ready, mock_engine, stop_all
from bench.quality_load import run_cell

MODEL = "bench-model"


async def _views(session: Any, router: str, engines: list[str]) -> tuple[list[int], list[int]]:
    async def engine(url: str) -> int:
        async with session.get(url + "/infera/kv_cache") as resp:
            return len((await resp.json())["cached"])

    async def indexed() -> dict[str, int]:
        async with session.get(router + "/v1/workers") as resp:
            return {w["http_url"].rstrip("/"): int(w["kv_blocks_indexed"]) for w in (await resp.json())["data"]}

    got = await asyncio.gather(indexed(), *(engine(e) for e in engines))
    index: dict[str, int] = got[0]  # type: ignore[assignment]
    return [index.get(e.rstrip("/"), index.get(e.rstrip("/") + "/v1", -1)) for e in engines], list(got[1:])  # type: ignore[arg-type]


async def play(router: str, w: workloads.Workload, engines: list[str], every: float) -> dict[str, Any]:
    import aiohttp

    samples: list[tuple[list[int], list[int]]] = []
    done = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        async def sample() -> None:
            while not done.is_set():
                samples.append(await _views(session, router, engines))
                try:
                    await asyncio.wait_for(done.wait(), every)
                except TimeoutError:
                    pass

        sampler = asyncio.create_task(sample())
        cell = await run_cell(router, w, MODEL, engines, 300.0)
        done.set()
        await sampler
        await asyncio.sleep(1.0)  # let the last batches arrive
        settled = await _views(session, router, engines)
        async with session.get(router + "/metrics") as resp:
            metrics = [ln for ln in (await resp.text()).splitlines() if ln.startswith("infera_routing_decisions")]
    diffs = [abs(r - e) for rs, es in samples for r, e in zip(rs, es, strict=True)]
    sizes = [e for _, es in samples for e in es]
    return {
        "requests": len(cell["outcomes"]), "errors": len(cell["errors"]), "samples": len(samples),
        "mean_abs_diff_blocks": sum(diffs) / max(len(diffs), 1), "max_abs_diff_blocks": max(diffs, default=0),
        "mean_engine_blocks": sum(sizes) / max(len(sizes), 1),
        "exact_share": sum(1 for d in diffs if d == 0) / max(len(diffs), 1),
        "settled_router": settled[0], "settled_engine": settled[1], "decisions": metrics,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="kv-aware-blocks")
    ap.add_argument("--workload", default="agentic")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--kv-blocks", type=int, default=2048)
    ap.add_argument("--every", type=float, default=0.1)
    args = ap.parse_args()
    from infera.kv.tokenizer import PromptRenderer

    tok = default_tokenizer_dir()
    PromptRenderer.from_dir(tok)
    w = next(x for x in workloads.build(True, 32, 20.0) if x.name == args.workload)
    log_dir = Path(tempfile.mkdtemp(prefix="infera-kv-view-"))
    extra = ["--num-kv-blocks", str(args.kv_blocks), "--max-num-seqs", "256"]
    engines = [mock_engine(f"engine-{k}", tok, MODEL, log_dir, args.speedup, extra) for k in range(args.engines)]
    procs = list(engines)
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        router = frontend("infera", tok, args.policy, engines, log_dir)
        procs.append(router)
        router.start()
        router.wait_ready("/health", 90, frontend_ready(len(engines)))
        t0 = time.monotonic()
        out = asyncio.run(play(router.url, w, [e.url for e in engines], args.every))
        out["wall_s"] = time.monotonic() - t0
    finally:
        stop_all(procs)
    print(json.dumps({"policy": args.policy, "workload": args.workload, **out}, indent=1))


if __name__ == "__main__":
    main()
