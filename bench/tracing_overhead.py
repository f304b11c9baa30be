"""Tracing and logging overhead: the frontend's CPU per request with telemetry off and on, side by side.

Frontends over the same 2 mock engines (x100000: engine time negligible), all live at once, kv-aware
over ~1k-token chat prompts, half streamed, ``max_tokens`` 8, closed loop at concurrency 4:

  off        no telemetry (the default)
  off-2      a second identical frontend: the noise floor (off-2 / off)
  log        --log-requests --log-format json (the request line to the process's log file)
  traced     --otel-exporter otlp whose HTTP client sends nothing (spans recorded and encoded, no export)
  otlp       --otel-exporter otlp to a local collector stub (OTLP/HTTP protobuf, answered 200)
  otlp-1s    otlp with OTEL_BSP_SCHEDULE_DELAY=1000 (a post every second rather than every 5 s)
  otlp-py    otlp with the pure-Python OTLP encoder (records queued and encoded in batches), not the C one
             (only with --only otlp-py,...)
  sampled    otlp with OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0.1
  all        otlp + --log-requests --log-format json

Each round runs every scenario once, in a shuffled order; CPU = the frontend's run time over its cell
(the scheduler's nanosecond clock, /proc/<pid>/task/*/schedstat summed over threads; utime+stime
ticks at 10 ms, ~1.3 % of a 300-request cell, too coarse for a 5 % target) / completed requests.
Figures are medians over rounds and ratios to ``off``.
``--together`` loads every frontend at once in each round instead (each at ``--concurrency``), so
that the box's drifting load (other jobs) falls on all scenarios of a round alike. ``--baseline DIR``
adds ``log@base``, ``otlp@base`` and ``all@base``: the same scenarios run from the ``infera`` package
under DIR (e.g. ``git archive OLD infera | tar -x -C DIR``), before and after a
change side by side in one run.

    nice -n 10 .venv/bin/python bench/tracing_overhead.py --quick   # ~2 min
    nice -n 10 .venv/bin/python bench/tracing_overhead.py           # ~6 min
    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/tracing_overhead.py --in-process --rounds 30 --requests 300
    .venv/bin/python bench/tracing_overhead.py --frontend[-noop] ... # (internal: a frontend [with a no-op exporter])
    .venv/bin/python bench/tracing_overhead.py --base-frontend DIR ...  # (internal: a frontend from DIR)
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODEL = "bench-model"
SCENARIOS: dict[str, tuple[tuple[str, ...], dict[str, str], bool]] = {
    # name: (frontend flags, env, no-op exporter)
    "off": ((), {}, False),
    "off-2": ((), {}, False),
    "log": (("--log-requests", "--log-format", "json"), {}, False),
    "traced": (("--otel-exporter", "otlp"), {}, True),
    "otlp": (("--otel-exporter", "otlp"), {}, False),
    "otlp-1s": (("--otel-exporter", "otlp"), {"OTEL_BSP_SCHEDULE_DELAY": "1000"}, False),
    "otlp-py": (("--otel-exporter", "otlp"), {"BENCH_OTLP_PYTHON": "1"}, False),
    "sampled": (("--otel-exporter", "otlp"),
                {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}, False),
    "all": (("--otel-exporter", "otlp", "--log-requests", "--log-format", "json"), {}, False),
}


BASELINE = ("log", "otlp", "all")
OPTIONAL = {"otlp-py"}  # run only when --only names them


def base_frontend(base: str, argv: Sequence[str]) -> int:
    """``python -m infera.server`` with the ``infera`` package under ``base`` (not this checkout's)."""
    here = str(Path(__file__).resolve().parent.parent)
    sys.path[:] = [base, *(p for p in sys.path if p not in (here, "", ".") and Path(p or ".").resolve() != Path(here))]
    from infera.server.__main__ import main

    assert Path(sys.modules["infera"].__file__ or "").resolve().is_relative_to(Path(base).resolve())
    return main(argv)


def wrapped_frontend(argv: Sequence[str], noop: bool) -> int:
    """``python -m infera.server``, started the same way for every scenario (how a process starts, what
    it imports and in which order, moves its CPU per request by a point or two for the rest of its life:
    ``traced`` alone started through this script read ~1-1.5 points under ``otlp``); with ``noop``, its
    ``otlp`` exporter takes every batch and sends nothing (spans are recorded and encoded as with OTLP;
    no HTTP)."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    import infera.telemetry.setup as setup
    from infera.server.__main__ import main

    class Taken:
        success = True

    class Client:
        def export(self, body: bytes) -> Taken:
            return Taken()

    class Noop(SpanExporter):
        _client = Client()

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if os.environ.get("BENCH_OTLP_PYTHON"):  # otlp-py: the pure-Python encoder (queued), the C index kept
        import infera.telemetry.otlp as otlp

        otlp._native_encoder = lambda: None
    real = setup.exporter_for
    if noop:
        setup.exporter_for = lambda name, out=None: Noop() if name == "otlp" else real(name, out)  # type: ignore[assignment]
    return main(argv)


class Collector:
    """An OTLP/HTTP collector stub on 127.0.0.1: reads each export request and answers 200 (empty body)."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length", "0"))
                self.rfile.read(n)
                outer.requests += 1
                outer.bytes += n
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def task_ns(pid: int) -> dict[int, int]:
    """Run time in ns of each live thread of a process, from /proc/<pid>/task/*/schedstat (the
    scheduler's clock: no 10 ms ticks, unlike utime+stime in /proc/<pid>/stat)."""
    out: dict[int, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return out


def cpu_between(pid: int, before: dict[int, int], after: dict[int, int]) -> tuple[float, float, int]:
    """CPU seconds of the main thread and of the other threads between two :func:`task_ns` reads, and
    how many threads ended in between (their time in the interval is lost: none should)."""
    main = (after.get(pid, 0) - before.get(pid, 0)) / 1e9
    other = sum(ns - before.get(tid, 0) for tid, ns in after.items() if tid != pid) / 1e9
    return main, other, sum(1 for tid in before if tid not in after)


def start_frontends(engines: list[Any], tok: Path, log_dir: Path, collector: Collector,
                    base: str = "", hash_seed: str = "0", generation: int = 0) -> dict[str, Any]:
    from bench.common import PYTHON, Proc, frontend_ready
    from harness import free_port, frontend_argv

    fronts: dict[str, Any] = {}
    for name, (flags, env, noop) in SCENARIOS.items():
        port = free_port()
        argv = frontend_argv(port, [e.url for e in engines], tokenizer=tok, policy="kv-aware", python=PYTHON,
                             args=("--log-level", "warning", *flags))
        server_args = argv[3:]  # after "python -m infera.server"
        argv = [PYTHON, str(Path(__file__).resolve()), "--frontend-noop" if noop else "--frontend", *server_args]
        if name.endswith("@base"):
            argv = [PYTHON, str(Path(__file__).resolve()), "--base-frontend", base, *server_args]
        proc = Proc(name, argv, port, log_dir / f"frontend-{name}-{generation}.log")
        # one hash seed for all: str hashes (dict and set layouts) differ per process otherwise, and with
        # them a process's CPU per request by a few percent (off-2 / off was 0.978, IQR 0.949-0.990, in a
        # quiet run with random seeds)
        seed = {"PYTHONHASHSEED": hash_seed} if hash_seed else {}
        proc.env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, **seed, **env})
        fronts[name] = proc
    for proc in fronts.values():
        proc.start()
    for proc in fronts.values():
        proc.wait_ready("/health", 120, frontend_ready(len(engines)))
    return fronts


async def measure(fronts: dict[str, Any], bodies: list[bytes], rounds: range, n: int, conc: int,
                  seed: int, together: bool = False) -> list[dict[str, Any]]:
    from bench.common import make_session, run_load

    rows: list[dict[str, Any]] = []
    rng = random.Random(seed)

    async def cell(session: Any, r: int, name: str) -> None:
        proc = fronts[name]
        c0, t0 = proc.cpu(), task_ns(proc.pid)
        res = await run_load(session, [proc.url + "/v1/chat/completions"], bodies, conc, n, 120, offset=r * 7919)
        ticks, t1 = proc.cpu() - c0, task_ns(proc.pid)
        main, other, ended = cpu_between(proc.pid, t0, t1)
        ok = max(res.ok, 1)
        cpu = main + other
        rows.append({"round": r, "scenario": name, "ok": res.ok, "errors": res.errors,
                     "cpu_us_per_req": cpu / ok * 1e6, "main_us_per_req": main / ok * 1e6,
                     "other_us_per_req": other / ok * 1e6, "ticks_us_per_req": ticks / ok * 1e6,
                     "threads_ended": ended, "rps": res.rps, "first_error": res.first_error})
        print(f"round {r} {name:8s} ok={res.ok} err={res.errors} cpu/req={cpu / ok * 1e6:7.0f} us "
              f"(other threads {other / ok * 1e6:5.0f}; ticks {ticks / ok * 1e6:7.0f})", flush=True)

    async with make_session(conc * (len(fronts) if together else 1)) as session:
        for proc in fronts.values():  # warm-up: tokenizer caches, connection pools
            await run_load(session, [proc.url + "/v1/chat/completions"], bodies, conc, 64, 30)
        for r in rounds:
            order = list(fronts)
            rng.shuffle(order)
            if together:  # every scenario loaded at once: the box's load drifts for all of them alike
                await asyncio.gather(*(cell(session, r, name) for name in order))
                continue
            for name in order:
                await cell(session, r, name)
    return rows


IN_PROCESS = ("off", "off-2", "log", "dropped", "recorded", "traced", "traced-py", "all")


def in_process_app(kind: str) -> tuple[Any, list[Any]]:
    """The app over a fake transport (2 workers, round-robin; tests/fakes.py) with ``kind``'s telemetry:
    ``dropped`` tracing on with every trace sampled out (the middleware and the record only),
    ``recorded`` spans recorded and handed to a processor that drops them (no encoding), ``traced`` the
    OTLP processor with a client that sends nothing (``traced-py``: its pure-Python encoder, not the C one),
    ``all`` that + the queued JSON request line. Returns
    the app and what runs its deferred work now (encoding, the request lines)."""
    import io

    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, DEFAULT_ON

    from infera.router.router import Router, RouterOptions
    from infera.server.app import build_app
    from infera.telemetry.logs import RequestLog
    from infera.telemetry.otlp import Encoder, OtlpProcessor
    from infera.telemetry.spans import Tracing
    from infera.telemetry.tracing import Telemetry
    from tests.fakes import FakeFleet, FakeTransport, worker

    class Drop(OtlpProcessor):
        def on_request(self, *args: Any) -> None:
            pass

    def otlp(cls: type[OtlpProcessor] = OtlpProcessor) -> OtlpProcessor:
        processor = cls(lambda body: True)
        if kind == "traced-py":
            processor._encoder = Encoder(native=False)
            processor._now = False
        return processor

    log = RequestLog("json", io.BytesIO(), queued=True) if kind in ("log", "all") else None
    processor = otlp(Drop if kind == "recorded" else OtlpProcessor) if kind not in ("off", "off-2", "log") else None
    tracing = Tracing(processor, ALWAYS_OFF if kind == "dropped" else DEFAULT_ON) if processor is not None else None
    telemetry = Telemetry(tracing, log)
    later = [x._later.run for x in (log, processor) if x is not None]
    router = Router(FakeFleet(worker("a"), worker("b")), FakeTransport(text="hello there you"), None, None,
                    RouterOptions(policy="round-robin"), rng=random.Random(1))
    return build_app(router, max_body_bytes=1 << 16, strip_patterns=[], telemetry=telemetry), later


async def asgi_request(app: Any, body: bytes) -> None:
    """One POST /v1/chat/completions through the app as raw ASGI calls (no HTTP client)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("bench", 80),
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    done = asyncio.Event()
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False):
            done.set()

    await app(scope, receive, send)
    done.set()
    if status != 200:
        raise RuntimeError(f"in-process request answered {status}")


async def in_process(rounds: int, n: int) -> dict[str, list[float]]:
    """CPU µs per request (this thread's, ``time.thread_time``) of each kind, per round, kinds shuffled in
    each round; the start-up heap frozen out of the GC as the server does."""
    import gc

    import orjson

    bodies = [orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"hello {i}"}],
                            "max_tokens": 8, "stream": i % 2 == 0}) for i in range(64)]
    built = {kind: in_process_app(kind) for kind in IN_PROCESS}
    apps = {kind: app for kind, (app, _) in built.items()}
    for app in apps.values():
        for i in range(200):
            await asgi_request(app, bodies[i % 64])
    gc.collect()
    gc.freeze()
    out: dict[str, list[float]] = {kind: [] for kind in apps}
    rng = random.Random(5)
    for _ in range(rounds):
        order = list(apps)
        rng.shuffle(order)
        for kind in order:
            app = apps[kind]
            t0 = time.thread_time_ns()
            for i in range(n):
                await asgi_request(app, bodies[i % 64])
            for run in built[kind][1]:  # what the cell left queued (encoding, request lines) is its cost too
                run()
            out[kind].append((time.thread_time_ns() - t0) / n / 1000)
    return out


def print_in_process(results: dict[str, list[float]], rounds: int, n: int) -> None:
    from bench.common import median, percentile

    print(f"in process, {rounds} rounds x {n} requests (raw ASGI over a fake transport, round-robin)")
    print("| kind | CPU µs/req (median) | minus off, per-round pairs (IQR) |")
    print("|---|--:|--:|")
    for kind, values in results.items():
        pairs = [v - o for v, o in zip(values, results["off"], strict=True)]
        print(f"| {kind} | {median(values):.1f} | {median(pairs):+.1f} ({percentile(pairs, 25):+.1f}.."
              f"{percentile(pairs, 75):+.1f}) |")


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    from statistics import fmean as mean

    from bench.common import median, percentile

    base = median([r["cpu_us_per_req"] for r in rows if r["scenario"] == "off"])
    out: dict[str, dict[str, float]] = {}
    for name in SCENARIOS:
        own = [r["cpu_us_per_req"] for r in rows if r["scenario"] == name]
        # per round, the ratio to that round's "off": less sensitive to the box's load drifting between rounds
        paired = [r["cpu_us_per_req"] / o["cpu_us_per_req"] for r in rows if r["scenario"] == name
                  for o in rows if o["scenario"] == "off" and o["round"] == r["round"]]
        # and to the mean of that round's two identical "off" frontends: one process's own bias (the
        # noise floor's median off 1.000) falls half as hard on every ratio
        offs = {r["round"]: mean([o["cpu_us_per_req"] for o in rows
                                  if o["scenario"] in ("off", "off-2") and o["round"] == r["round"]]) for r in rows}
        to_offs = [r["cpu_us_per_req"] / offs[r["round"]] for r in rows if r["scenario"] == name]
        out[name] = {"cpu_us_per_req": median(own), "ratio": median(own) / base, "paired_ratio": median(paired),
                     "paired_q1": percentile(paired, 25), "paired_q3": percentile(paired, 75),
                     "offs_ratio": median(to_offs), "offs_q1": percentile(to_offs, 25),
                     "offs_q3": percentile(to_offs, 75),
                     "main_us_per_req": median([r["main_us_per_req"] for r in rows if r["scenario"] == name]),
                     "other_us_per_req": median([r["other_us_per_req"] for r in rows if r["scenario"] == name]),
                     "errors": float(sum(r["errors"] for r in rows if r["scenario"] == name)),
                     "threads_ended": float(sum(r.get("threads_ended", 0) for r in rows if r["scenario"] == name))}
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("--frontend", "--frontend-noop"):
        return wrapped_frontend(sys.argv[2:], noop=sys.argv[1] == "--frontend-noop")
    if len(sys.argv) > 2 and sys.argv[1] == "--base-frontend":
        return base_frontend(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 200 requests")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--together", action="store_true",
                        help="load every frontend at once in each round (paired against the same box load)")
    parser.add_argument("--in-process", action="store_true",
                        help="no processes: the app in this process over a fake transport, CPU per request of "
                             "each telemetry kind (off, off-2, log, dropped, recorded, traced, all)")
    parser.add_argument("--generations", type=int, default=1, metavar="G",
                        help="split the rounds over G sets of frontend processes, each started afresh: a process's "
                             "own bias (memory layout) then varies across rounds like the rest of the noise")
    parser.add_argument("--hash-seed", default="0", metavar="N",
                        help="PYTHONHASHSEED of every frontend ('' = each its own random seed)")
    parser.add_argument("--baseline", default="", metavar="DIR",
                        help="also run log, otlp and all from the infera package under DIR (name@base)")
    parser.add_argument("--only", default="", metavar="A,B",
                        help="run only these scenarios (off and off-2 always; with --baseline, name@base too): "
                             "fewer frontends, more requests each in the same time")
    args = parser.parse_args()
    keep = {"off", "off-2", *args.only.split(",")} if args.only else set(SCENARIOS) - OPTIONAL
    for name in [n for n in SCENARIOS if n not in keep]:
        del SCENARIOS[name]
    if args.baseline:
        for name in [n for n in BASELINE if n in SCENARIOS]:
            SCENARIOS[f"{name}@base"] = SCENARIOS[name]
    if args.quick:
        args.rounds, args.requests = 2, 200
    if args.in_process:
        print_in_process(asyncio.run(in_process(args.rounds, args.requests)), args.rounds, args.requests)
        return 0

    import tempfile

    from bench.common import chat_body, default_tokenizer_dir, machine_info, mock_engine, stop_all, write_results

    tok = default_tokenizer_dir()
    bodies = [chat_body(i, MODEL, stream=i % 2 == 0, max_tokens=8) for i in range(512)]
    log_dir = Path(tempfile.mkdtemp(prefix="tracing-overhead-"))
    engines = [mock_engine(f"engine-{i}", tok, MODEL, log_dir) for i in range(2)]
    fronts: dict[str, Any] = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with Collector() as collector:
        try:
            for e in engines:
                e.start()
            for e in engines:
                e.wait_ready("/infera/worker", 60)
            rows: list[dict[str, Any]] = []
            generations = max(1, min(args.generations, args.rounds))
            for g in range(generations):
                fronts = start_frontends(engines, tok, log_dir, collector, args.baseline, args.hash_seed, g)
                rounds = range(args.rounds * g // generations, args.rounds * (g + 1) // generations)
                rows += asyncio.run(measure(fronts, bodies, rounds, args.requests, args.concurrency, seed=11 + g,
                                            together=args.together))
                if g + 1 < generations:
                    stop_all(list(fronts.values()))
        finally:
            stop_all([*fronts.values(), *engines])
        exported = (collector.requests, collector.bytes)
    summary = summarize(rows)
    print(f"\nrun {started}, {args.rounds} rounds x {args.requests} requests, concurrency {args.concurrency}, "
          f"{args.generations} generation(s) of frontend processes"
          f"{' (all frontends at once)' if args.together else ''}, "
          f"collector got {exported[0]} export requests ({exported[1] / 1e6:.1f} MB)")
    floor = summary["off-2"]
    print(f"noise floor (off-2 / off, per-round pairs): {floor['paired_ratio']:.3f} "
          f"(IQR {floor['paired_q1']:.3f}-{floor['paired_q3']:.3f}); threads ended inside a cell: "
          f"{sum(int(s['threads_ended']) for s in summary.values())}")
    print("| scenario | frontend CPU µs/req | main thread | other threads | × off | × off, per-round pairs (IQR) "
          "| × mean(off, off-2), per round (IQR) |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, s in summary.items():
        print(f"| {name} | {s['cpu_us_per_req']:.0f} | {s['main_us_per_req']:.0f} | {s['other_us_per_req']:.0f} | "
              f"{s['ratio']:.3f} | {s['paired_ratio']:.3f} ({s['paired_q1']:.3f}-{s['paired_q3']:.3f}) | "
              f"{s['offs_ratio']:.3f} ({s['offs_q1']:.3f}-{s['offs_q3']:.3f}) |")
    path = write_results("tracing_overhead", {"machine": machine_info(), "args": vars(args), "rows": rows,
                                              "summary": summary, "collector": exported, "logs": str(log_dir)})
    print(f"results: {path}\nlogs: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
