"""Where a live kv-aware request's CPU goes beyond a round-robin one's (issue 15, helper live9).

Runs ``bench/router_overhead.py`` (rr and kv scenarios, two mock engines, ~1k-token chats) with a
``sitecustomize`` that, in each infera frontend only, profiles the event-loop thread with cProfile on
``time.thread_time`` (CPU, not wall: py-spy's samples on this 2-core box count a frontend preempted
after its socket writes as busy) and times every GC collection (``gc.callbacks``; from the start-up
freeze in infera/server/__main__.py on). The frontend dumps both at SIGTERM. Prints, per request and
per policy: profiled µs (cProfile inflates small calls ~3x; read shares, not absolutes), Python calls,
GC collections and CPU, and kv - rr per area.

    PYTHONPATH=$PWD .venv/bin/python bench/live_kv_profile.py [--n32 5000] [--n1 400]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import FRONTEND_SITE_HEAD

SITE = FRONTEND_SITE_HEAD + r'''    import cProfile, gc, json, signal, time
    _pol = _cmd[_cmd.index(b"--router-policy") + 1].decode()
    _out = os.environ["LIVE_KV_PROFILE_DIR"]
    _prof = cProfile.Profile(time.thread_time)
    _gc = {"n": [0, 0, 0], "cpu": [0.0, 0.0, 0.0]}
    _t0 = [0.0]
    def _cb(phase, info):
        if not gc.get_freeze_count():
            return  # start-up (imports, tokenizer) collects at Python's 700 until the server freezes its heap
        if phase == "start":
            _t0[0] = time.thread_time()
        else:
            _gc["n"][info["generation"]] += 1
            _gc["cpu"][info["generation"]] += time.thread_time() - _t0[0]
    gc.callbacks.append(_cb)
    _done = []
    def _dump():
        if not _done:
            _done.append(1)
            _prof.disable()
            _prof.dump_stats(f"{_out}/{_pol}.pstats")
            open(f"{_out}/{_pol}.gc.json", "w").write(json.dumps(_gc))
    _orig = signal.signal
    def _patched(sig, handler):
        if sig == signal.SIGTERM and callable(handler):
            inner = handler
            def handler(s, f, inner=inner):
                _dump()
                return inner(s, f)
        return _orig(sig, handler)
    signal.signal = _patched
    _prof.enable()
'''

# (label, function name, file suffix): cumulative CPU of these frames per request
AREAS = [
    ("whole event loop (Server.run)", "run", "uvicorn/server.py"),
    ("  request task (LeanPath.serve)", "serve", "infera/server/lean.py"),
    ("    router.dispatch", "dispatch", "infera/router/router.py"),
    ("      context (_build_context)", "_build_context", "infera/router/router.py"),
    ("        prompt cache encode_within", "encode_within", "infera/kv/prompt_cache.py"),
    ("        chat template render_chat", "render_chat", "infera/kv/tokenizer.py"),
    ("      pick (_pick)", "_pick", "infera/router/router.py"),
    ("        KvTtftPolicy.score", "score", "infera/router/kv_ttft.py"),
    ("      Legs.place (tickets, predictions)", "place", "infera/router/legs.py"),
    ("        PrefixIndex.predict", "predict", "infera/kv/index.py"),
    ("      Legs.run (send, first byte)", "run", "infera/router/legs.py"),
    ("    intake (take_quick)", "take_quick", "infera/server/intake.py"),
    ("    answer (LeanPath.answer)", "answer", "infera/server/lean.py"),
    ("  KV events (zmq readable)", "readable", "infera/transport/zmq_events.py"),
    ("    PrefixIndex.apply", "apply", "infera/kv/index.py"),
]


def _load(path: Path) -> dict[tuple[str, int, str], tuple[int, int, float, float, object]]:
    return pstats.Stats(str(path)).stats  # type: ignore[attr-defined, no-any-return]


def _cum(stats: dict[tuple[str, int, str], tuple[int, int, float, float, object]], name: str, suffix: str) -> float:
    return sum(v[3] for (f, _, n), v in stats.items() if n == name and f.endswith(suffix))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n1", type=int, default=400)
    ap.add_argument("--n32", type=int, default=5000)
    args = ap.parse_args()
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITE)
        env = {**os.environ, "LIVE_KV_PROFILE_DIR": tmp,
               "PYTHONPATH": os.pathsep.join([str(here.parent), str(site), os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, str(here / "router_overhead.py"), "--quick", "--n1", str(args.n1),
                              "--n32", str(args.n32), "--scenarios", "rr,kv", "--no-install", "--skip-routing-cpu",
                              "--no-plot"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             check=True).stdout
        # requests the frontend served: the bench's warm-up and measured cells, read from its decision counters
        n = {pol: sum(float(x.split("} ", 1)[1].split(";")[0]) for x in line.split(f'policy="{pol}"')[1:])
             for pol in ("round-robin", "kv-aware") for line in out.splitlines() if f'policy="{pol}"' in line}
        stats = {pol: _load(Path(tmp) / f"{pol}.pstats") for pol in n}
        gcs = {pol: json.loads((Path(tmp) / f"{pol}.gc.json").read_text()) for pol in n}
    print(f"requests per frontend: {n}")
    print(f"{'area (cumulative, profiled us/request)':44s} {'kv':>8s} {'rr':>8s} {'kv-rr':>8s}")
    for label, name, suffix in AREAS:
        kv, rr = (_cum(stats[p], name, suffix) / n[p] * 1e6 for p in ("kv-aware", "round-robin"))
        print(f"{label:44s} {kv:8.1f} {rr:8.1f} {kv - rr:8.1f}")
    for p in n:
        calls = sum(v[1] for v in stats[p].values()) / n[p]
        g = gcs[p]
        print(f"{p}: {calls:.0f} Python calls/request (incl. start-up); GC collections per gen {g['n']}, "
              f"gen0+1 CPU {sum(g['cpu'][:2]) / n[p] * 1e6:.1f} us/request, gen2 {g['cpu'][2] * 1e3:.0f} ms in all")


if __name__ == "__main__":
    main()
