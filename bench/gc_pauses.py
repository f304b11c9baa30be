"""The cyclic GC's CPU in a loaded kv-aware frontend, at a given threshold (issue 15, helper kvcpu2).

Two mock engines (x100000) and one kv-aware frontend started through this file (``--wrap``), which
times every collection by generation (``gc.callbacks``, thread CPU) and, at ``GCTHRESH`` (e.g.
``5000,10,10``), sets ``gc.set_threshold`` after the server's own start-up hook. 200 warm-up then 3000
~1k-token chat requests (half streamed, 8 tokens out, 16 in flight); prints the frontend's CPU per
request and the collections (count, ms) during the 3000.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/gc_pauses.py              # the server's setting
    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/gc_pauses.py 700,10,10    # CPython's default
    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/gc_pauses.py --census     # + what the young ones scan

``--census`` (helper gc10): at the start of every young collection during the 3000, the frontend counts the
tracked objects of the young generation by type (``gc.get_objects(0)``: what the requests left since the last
collection, plus those in flight) and the run prints the commonest per collection. It adds that walk's CPU to
the GC figures: compare trees without it.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import gc
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "bench-model"


def wrap() -> None:
    stats = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    start = [0.0]
    census: collections.Counter[str] = collections.Counter()
    referents: collections.Counter[str] = collections.Counter()  # by type: what the collection visits in them
    counting = [False]  # between the two SIGUSR1s only
    sizes = [0, 0]  # young collections counted, young objects in them

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if counting[0] and info["generation"] == 0 and os.environ.get("GCCENSUS"):
                young = gc.get_objects(0)
                sizes[0] += 1
                sizes[1] += len(young)
                census.update(type(o).__qualname__ for o in young)
                for o in young:
                    referents[type(o).__qualname__] += len(gc.get_referents(o))
                del young
            start[0] = time.thread_time()
        else:
            s = stats[info["generation"]]
            s[0] += 1
            s[1] += time.thread_time() - start[0]

    gc.callbacks.append(timed)
    import infera.server.__main__ as server

    if os.environ.get("GCTHRESH"):
        hook = server.freeze_heap
        want = tuple(map(int, os.environ["GCTHRESH"].split(",")))

        async def freeze_then_set() -> None:
            await hook()
            gc.set_threshold(*want)

        server.freeze_heap = freeze_then_set  # type: ignore[assignment]

    def dump(*_: object) -> None:
        if counting[0] and os.environ.get("GCCENSUS"):  # first: the driver waits for the stats' second line
            with open(os.environ["GCCENSUS"], "w") as f:
                f.write(repr((sizes, [(k, n, referents[k]) for k, n in census.most_common(20)])) + "\n")
        counting[0] = not counting[0]
        with open(os.environ["GCSTATS"], "a") as f:
            f.write(repr({g: (n, t * 1e3) for g, (n, t) in stats.items()}) + "\n")

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["infera.server", *sys.argv[2:]]
    sys.exit(server.main())


def drive(threshold: str, census: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.common import (
        chat_body,
        default_tokenizer_dir,
        frontend,
        frontend_ready,
        make_session,
        mock_engine,
        run_load,
        stop_all,
    )

    tok = default_tokenizer_dir()
    log = Path(tempfile.mkdtemp(prefix="infera-bench-gc-"))
    stats = log / "gc.txt"
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log) for i in range(2)]
    front = frontend("kv", tok, "kv-aware", engines, log)
    front.argv = [front.argv[0], __file__, "--wrap", *front.argv[front.argv.index("infera.server") + 1:]]
    front.env["GCSTATS"] = str(stats)
    if census:
        front.env["GCCENSUS"] = str(log / "census.txt")
    if threshold:
        front.env["GCTHRESH"] = threshold
    bodies = [chat_body(i, MODEL, i % 2 == 1, 8) for i in range(3000)]

    async def load() -> None:
        url = [front.url + "/v1/chat/completions"]
        async with make_session(16) as session:
            await run_load(session, url, bodies[:200], 16, 200, 60)
            os.kill(front.pid, signal.SIGUSR1)
            cpu0 = front.cpu()
            res = await run_load(session, url, bodies, 16, len(bodies), 300)
            cpu = front.cpu() - cpu0
            os.kill(front.pid, signal.SIGUSR1)
        print(f"threshold {threshold or 'server default'}: {res.ok} ok, frontend CPU {cpu / res.ok * 1e6:.0f} µs/req")

    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        front.start()
        front.wait_ready("/health", 90, frontend_ready(2))
        asyncio.run(load())
        front.wait_until(lambda: len(stats.read_text().splitlines()) == 2 if stats.exists() else False, 10, "stats")
    finally:
        stop_all([front, *engines])
    a, b = (ast.literal_eval(line) for line in stats.read_text().splitlines())  # our own repr of literals
    total = 0.0
    for g in (0, 1, 2):
        n, ms = b[g][0] - a[g][0], b[g][1] - a[g][1]
        total += ms
        print(f"  generation {g}: {n} collections, {ms:.1f} ms")
    print(f"  GC total {total:.1f} ms over {len(bodies)} requests: {total * 1e3 / len(bodies):.0f} µs/req")
    if census:
        (n, objects), common = ast.literal_eval((log / "census.txt").read_text())  # our own repr of literals
        print(f"  census: {n} young collections, {objects / max(n, 1):.0f} tracked young objects each; by type, per"
              " collection: objects, their referents")
        for name, k, refs in common:
            print(f"    {name:<28} {k / max(n, 1):8.0f} {refs / max(n, 1):8.0f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--wrap"]:
        wrap()
    elif {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    else:
        args = [a for a in sys.argv[1:] if a != "--census"]
        drive(args[0] if args else "", "--census" in sys.argv[1:])
