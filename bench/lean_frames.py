"""Python frames and bytecodes per request on the live lean path, by package: a count, not a time, so a loaded box
cannot blur it. One mock engine; a child per tree (the ref's export, this tree) runs ``bench/lean_inproc.py``'s
frontend and client (round-robin, non-streamed or ``--stream``ed, real sockets), warms up, then traces ``--n``
requests with ``sys.settrace`` and opcode events (the client's own frames and bytecodes are counted too, the same in
both trees).

    PYTHONPATH=$PWD .venv/bin/python bench/lean_frames.py --ref main --n 400
    PYTHONPATH=$PWD .venv/bin/python bench/lean_frames.py --ref main --n 400 --stream
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # not first: a child's PYTHONPATH picks its infera

GROUPS = ("infera/", "uvicorn/", "starlette/", "prometheus_client/", "asyncio/", "bench/")


def child(engine_url: str, n: int, stream: bool = False, max_tokens: int = 8) -> None:
    import bench.lean_inproc as li
    from bench.common import opcode_tracer

    ops: collections.Counter[str] = collections.Counter()
    frames: collections.Counter[str] = collections.Counter()

    def group(filename: str) -> str:
        return next((g.rstrip("/") for g in GROUPS if g in filename), "other")

    tracer = opcode_tracer(lambda frame: group(frame.f_code.co_filename), frames, ops)

    drive = li._drive

    async def traced(port: int, bodies: list[bytes], warmup: int, _: int, __: int = 1) -> dict[str, Any]:
        await drive(port, bodies, 0, 300)
        sys.settrace(tracer)
        try:
            await drive(port, bodies, 0, n)
        finally:
            sys.settrace(None)
        return {"frames": sum(frames.values()) / n, "ops": sum(ops.values()) / n,
                "by_package": {k: [frames[k] / n, ops[k] / n] for k in sorted(frames)}}

    li._drive = traced  # type: ignore[assignment]
    li.child(engine_url, 0, 0, stream, 1, max_tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="git ref of the 'before' frontend")
    ap.add_argument("--n", type=int, default=400, help="traced requests per tree")
    ap.add_argument("--stream", action="store_true", help="streamed requests (SSE, one event per token)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2] == "1", int(args.child[3]))
        return
    from bench.common import PYTHON, REPO, default_tokenizer_dir, export_ref, mock_engine, stop_all

    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-lean-frames-"))
    base = export_ref(args.ref, log_dir / "base")
    trees = {args.ref: f"{base}{os.pathsep}{REPO}", "branch": str(REPO)}
    engine = mock_engine("engine", default_tokenizer_dir(), "bench-model", log_dir)
    results: dict[str, dict[str, Any]] = {}
    try:
        engine.start()
        engine.wait_ready("/infera/worker", 60)
        for name, path in trees.items():
            out = subprocess.run([PYTHON, __file__, "--child", engine.url, str(args.n), str(int(args.stream)),
                                  str(args.max_tokens)],
                                 env={**os.environ, "PYTHONPATH": path}, check=True, capture_output=True,
                                 text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            want = base / "infera" if name == args.ref else REPO / "infera"
            if Path(result.pop("infera")) != want:
                raise SystemExit(f"the {name} child did not import infera from {want}")
            results[name] = result
    finally:
        stop_all([engine])
    ref, branch = results[args.ref], results["branch"]
    print(f"| per request | {args.ref} | branch | ratio |\n|---|--:|--:|--:|")
    for key in ("frames", "ops"):
        print(f"| {key} | {ref[key]:.1f} | {branch[key]:.1f} | {branch[key] / ref[key]:.3f}x |")
    for package in sorted(set(ref["by_package"]) | set(branch["by_package"])):
        a, b = ref["by_package"].get(package, [0, 0]), branch["by_package"].get(package, [0, 0])
        print(f"| {package} frames / ops | {a[0]:.1f} / {a[1]:.0f} | {b[0]:.1f} / {b[1]:.0f} | |")


if __name__ == "__main__":
    main()
