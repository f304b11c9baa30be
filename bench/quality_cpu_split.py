"""Where routing_quality's router CPU per request goes (issue 15, helper rq14).

bench/routing_quality.py's CPU column (router process CPU over a cell / requests) is ~5-10x
bench/router_overhead.py's per-request figure. This plays the same workloads (``--quick``, the same
engines, KV capacity and routers as routing_quality) and splits that column:

- per variant of each cell: ``stream`` (routing_quality's own requests: SSE, usage in the last chunk)
  and ``whole`` (the same requests with ``"stream": false``): their difference is the relay's cost of a
  stream's chunks, for infera and for the peers alike;
- idle: the router's CPU over ``--idle`` seconds with no request, before each cell, per second, times
  the cell's wall time, per request;
- infera only, from its /metrics before and after the cell: relayed chunks per request (the
  inter-token histogram counts one sample per chunk after the first), KV-event batches per request;
- per thread (``/proc/<pid>/task``): the event loop's thread and the rest (libzmq's I/O thread,
  tokenizer threads); ``wakes``: voluntary context switches of all threads per request (about the event loop's
  wake-ups: how many chunks one wake-up serves is the workload's density, not the relay's code);
- ``--timers``: each infera frontend times its stages (context, pick, ``Legs.place``, the KV events'
  ``deliver``, the whole intake (``ZmqEventSource._ready``), the index's clear, ``StreamTally.feed``) in
  thread CPU between two signals (SIGUSR1 at a cell's start installs the wrappers, SIGUSR2 at its end dumps
  them: only the cell counts), times every GC collection and counts the KV batches, BlockStored and
  BlockRemoved events and ZMTP bytes the index took (from its counters: every intake path) and the blocks it
  holds; ``QUALITY_SPLIT_INTAKE=1`` times the KV intake's parts too; a timer costs ~2 µs (two
  ``clock_gettime`` syscalls);
- ``--profile``: the same window profiled with cProfile on ``time.thread_time``; prints cumulative
  profiled µs per request per area (cProfile inflates small calls ~3x: read shares).

Client side, per request: SSE events and body reads received.

    PYTHONPATH=$PWD .venv/bin/python bench/quality_cpu_split.py --workloads tenants,multiturn --no-install [--timers]

Findings: bench/README.md, "Issue 15, twelfth round: routing_quality's CPU per request, diagnosed".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers, quality_load, routing_quality, workloads
from bench.common import FRONTEND_SITE_HEAD, default_tokenizer_dir, http_get, mock_engine, stop_all
from bench.quality_load import Outcome, warm_up

SITE = FRONTEND_SITE_HEAD + r'''    import cProfile, gc, json, signal, time
    _pol = _cmd[_cmd.index(b"--router-policy") + 1].decode()
    _out = os.environ["QUALITY_SPLIT_PROFILE_DIR"]
    _st = {"prof": None, "gc": None, "t0": 0.0, "k": 0}
    def _cb(phase, info):
        g = _st["gc"]
        if g is None:
            return
        if phase == "start":
            _st["t0"] = time.thread_time()
        else:
            g["n"][info["generation"]] += 1
            g["cpu"][info["generation"]] += time.thread_time() - _st["t0"]
    gc.callbacks.append(_cb)
    def _on(sig, frame):
        _st["gc"] = {"n": [0, 0, 0], "cpu": [0.0, 0.0, 0.0]}
        _st["prof"] = cProfile.Profile(time.thread_time)
        _st["prof"].enable()
    def _off(sig, frame):
        p, g = _st["prof"], _st["gc"]
        if p is None:
            return
        p.disable()
        _st["prof"] = _st["gc"] = None
        tag = os.environ.get("QUALITY_SPLIT_TAG", "")
        k = _st["k"] = _st["k"] + 1
        p.dump_stats(f"{_out}/{tag}-{_pol}-{k}.pstats")
        open(f"{_out}/{tag}-{_pol}-{k}.gc.json", "w").write(json.dumps(g))
    signal.signal(signal.SIGUSR1, _on)
    signal.signal(signal.SIGUSR2, _off)
'''

TIMERS_SITE = FRONTEND_SITE_HEAD + r'''    import functools, gc, json, signal, time
    _pol = _cmd[_cmd.index(b"--router-policy") + 1].decode()
    _out = os.environ["QUALITY_SPLIT_PROFILE_DIR"]
    _st = {"on": False, "t": {}, "k": 0, "gc": [0, 0.0], "gct0": 0.0, "t0": 0.0}
    _tt = time.thread_time
    def _cb(phase, info):
        if not _st["on"]:
            return
        if phase == "start":
            _st["gct0"] = _tt()
        else:
            _st["gc"][0] += 1
            _st["gc"][1] += _tt() - _st["gct0"]
    gc.callbacks.append(_cb)
    def _timed(name, fn):
        @functools.wraps(fn)
        def w(*a, **k):
            if not _st["on"]:
                return fn(*a, **k)
            t0 = _tt()
            try:
                return fn(*a, **k)
            finally:
                d = _st["t"].setdefault(name, [0, 0.0])
                d[0] += 1
                d[1] += _tt() - t0
        return w
    # The KV intake's totals, read from the index itself (the C drains read the sockets themselves: no payload
    # passes Python): [batches, stored events, removed events, clears, bytes read over ZMTP, blocks held]. An
    # index's counters and blocks are taken when it is first seen in the window (before that call's apply) and at
    # the window's end; the batches are counted as applied, a ZMTP socket's bytes from its TCP_INFO.
    _seen = {"ix": {}, "fds": {}, "batches": 0}
    def _kv_totals(ix):
        c = ix.counters
        return [0, c.block_stored, c.block_removed, c.all_blocks_cleared, 0,
                sum(len(w.blocks) for w in ix._workers.values())]
    def _tcp_bytes(fd):
        import socket, struct
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            return 0
        try:
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            return struct.unpack_from("Q", info, 128)[0] if len(info) >= 136 else 0  # tcpi_bytes_received
        except OSError:
            return 0
        finally:
            s.close()
    def _seeing(fn, batches, fd_at=None):
        @functools.wraps(fn)
        def w(self, *a, **k):
            if not _st["on"]:
                return fn(self, *a, **k)
            if self not in _seen["ix"]:
                _seen["ix"][self] = _kv_totals(self)
            if fd_at is not None and a[fd_at] not in _seen["fds"]:
                _seen["fds"][a[fd_at]] = _tcp_bytes(a[fd_at])
            r = fn(self, *a, **k)
            if not _st.get("ready"):
                _seen["batches"] += batches(r)
            return r
        return w
    def _kv_window():
        ev = [0, 0, 0, 0, 0, 0]
        for ix, t0 in _seen["ix"].items():
            ev = [e + b - a for e, a, b in zip(ev, t0, _kv_totals(ix))]
        ev[0] = _seen["batches"]
        ev[4] = sum(_tcp_bytes(fd) - b0 for fd, b0 in _seen["fds"].items())
        return ev
    _pc = time.perf_counter_ns
    def _walled(name, fn):
        @functools.wraps(fn)
        def w(*a, **k):
            if not _st["on"]:
                return fn(*a, **k)
            t0 = _pc()
            try:
                return fn(*a, **k)
            finally:
                _st["w"].setdefault(name, []).append(_pc() - t0)
        return w
    def _install():
        if _st.get("installed"):
            return
        _st["installed"] = True
        from infera.router import router as R, legs as L
        from infera.transport import zmq_events as Z
        from infera.server import tally as T
        R.Router._build_context = _timed("context", R.Router._build_context)
        from infera.kv import tokenizer as K, prompt_cache as PC, codecs as CO
        K.PromptRenderer.render_chat = _timed("context: render", K.PromptRenderer.render_chat)
        _ew = _timed("context: prompt cache", PC.PromptCache.encode_within)
        def _within(self, *a, **k):
            if not self.__dict__.get("_tw"):
                self._encode_tail = _timed("context: - the tail's BPE", self._encode_tail)
                self._encode = _timed("context: - a whole prompt's BPE", self._encode)
                if getattr(self, "_encode_packed", None) is not None:
                    self._encode_packed = _timed("context: - the tail's BPE (packed)", self._encode_packed)
                    if isinstance(getattr(self, "_packer", None), tuple):  # an ASCII tail's C call, timed alike
                        p = self._packer
                        self._packer = (self._encode_packed, _timed("context: - the tail's BPE (packed)", p[1]), *p[2:])
                if getattr(self, "_native", None) is not None and hasattr(self, "_packer"):
                    # ctx20's encode_within calls prompt_tail itself on the C path (not through _find): timed alike
                    import types
                    nat = self._native
                    names = [n for n in dir(nat) if not n.startswith("__")]
                    self._native = types.SimpleNamespace(**{n: getattr(nat, n) for n in names})
                    self._native.prompt_tail = _timed("context: - lookup", nat.prompt_tail)
                self._tw = True
            return _ew(self, *a, **k)
        PC.PromptCache.encode_within = _within
        PC.PromptCache._find = _timed("context: - lookup", PC.PromptCache._find)
        PC.extend_hashes = _timed("context: - block hashes", PC.extend_hashes)
        PC.PromptCache._entry_native = _timed("context: - the entry's cuts", PC.PromptCache._entry_native)
        PC.PromptCache._store = _timed("context: - store", PC.PromptCache._store)
        if hasattr(PC.PromptCache, "_extend_native"):  # a hit's rest in one C call (the tail's BPE timed inside it too)
            PC.PromptCache._extend_native = _timed("context: - a hit's rest (tail, ids, hashes, cuts, store)",
                                                   PC.PromptCache._extend_native)
        R.Router._pick = _timed("pick", R.Router._pick)
        L.Legs.place = _timed("legs.place", L.Legs.place)
        T.StreamTally.feed = _timed("tally.feed", T.StreamTally.feed)
        from infera.kv import index as I
        I.PrefixIndex._clear = _timed("index clear (AllBlocksCleared)", I.PrefixIndex._clear)
        Z.deliver = _timed("kv deliver (decode+apply)", Z.deliver)
        I.PrefixIndex.apply = _seeing(I.PrefixIndex.apply, lambda r: 1)
        I.PrefixIndex.apply_payload = _seeing(I.PrefixIndex.apply_payload, bool)
        I.PrefixIndex.drain_socket = _seeing(I.PrefixIndex.drain_socket, lambda r: 0 if r is None else r[2])
        I.PrefixIndex.drain_stream = _seeing(I.PrefixIndex.drain_stream, lambda r: 0 if r is None else r[2], 1)
        # A catch-up in one call (catchup18; bound once by the feed since intake20, PrefixIndex.ready_sink) is counted
        # around the timer, not inside it: its batches from the feed's book (the bound partial's 4th argument, or
        # the feed's ``batches``), its streams' fds from the source, its index's totals from the index (or the
        # partial's workers and counters); the drains inside it do not count again (``_st["ready"]``)
        _rd = _timed("kv intake (epoll, reads, apply)", Z.ZmqEventSource._ready)
        def _ready_seen(self):
            sink = self._ready_sink
            if not _st["on"] or sink is None or not self._streams:
                return _rd(self)
            if isinstance(sink, functools.partial):
                workers, _, counters, book = sink.args[:4]
                ix = _seen.setdefault("bound", {}).get(id(workers))
                if ix is None:  # what _kv_totals reads of an index (hashable: a key of _seen["ix"])
                    ix = _seen["bound"][id(workers)] = type("BoundIndex", (), {"counters": counters,
                                                                               "_workers": workers})()
            else:  # the feed's on_ready
                ix, book = sink.__self__.index, sink.__self__.batches
            if ix not in _seen["ix"]:
                _seen["ix"][ix] = _kv_totals(ix)
            for fd in self._streams:
                if fd not in _seen["fds"]:
                    _seen["fds"][fd] = _tcp_bytes(fd)
            b0 = sum(book.values())
            _st["ready"] = True
            try:
                return _rd(self)
            finally:
                _st["ready"] = False
                _seen["batches"] += sum(book.values()) - b0
        Z.ZmqEventSource._ready = _ready_seen
        if os.environ.get("QUALITY_SPLIT_INTAKE"):  # the intake's parts in wall time (a vDSO clock, ~0.1 µs a read,
            # where the thread-CPU clock is a ~2 µs syscall): every call kept, medians printed
            Z.ZmqEventSource.catch_up = _walled("kv: catch_up", Z.ZmqEventSource.catch_up)
            Z.ZmqEventSource._ready = _walled("kv: _ready", Z.ZmqEventSource._ready)
            I.PrefixIndex._applied = _walled("kv: - PrefixIndex._applied", I.PrefixIndex._applied)
            ds = I.PrefixIndex.drain_stream
            def drain_stream(self, *a, **k):
                if not self.__dict__.get("_ti"):
                    self._stream = _walled("kv: - C drain_stream", self._stream)
                    self._ti = True
                return ds(self, *a, **k)
            I.PrefixIndex.drain_stream = _walled("kv: - PrefixIndex.drain_stream", drain_stream)
    def _on(sig, frame):
        _install()
        _st["t"] = {}
        _st["gc"] = [0, 0.0]
        _st["w"] = {}
        _seen["ix"], _seen["fds"], _seen["batches"] = {}, {}, 0
        _st["t0"] = _tt()
        _st["on"] = True
    def _off(sig, frame):
        if not _st["on"]:
            return
        _st["on"] = False
        k = _st["k"] = _st["k"] + 1
        out = {"timers": _st["t"], "gc": _st["gc"], "loop": _tt() - _st["t0"], "events": _kv_window(),
               "walls": _st.get("w", {})}
        tag = os.environ.get("QUALITY_SPLIT_TAG", "")
        open(f"{_out}/{tag}-{_pol}-{k}.timers.json", "w").write(json.dumps(out))
    signal.signal(signal.SIGUSR1, _on)
    signal.signal(signal.SIGUSR2, _off)
'''

# (label, function name, file suffix): cumulative profiled CPU of these frames per request
AREAS = [
    ("whole loop thread (uvicorn Server.run)", "run", "uvicorn/server.py"),
    ("  request task (LeanPath.serve)", "serve", "infera/server/lean.py"),
    ("    router.dispatch", "dispatch", "infera/router/router.py"),
    ("      context (_build_context)", "_build_context", "infera/router/router.py"),
    ("      pick (_pick)", "_pick", "infera/router/router.py"),
    ("      Legs.place", "place", "infera/router/legs.py"),
    ("      Legs.run (send, first byte)", "run", "infera/router/legs.py"),
    ("    SSE relay (SseRelay.__call__)", "__call__", "infera/server/relay.py"),
    ("      StreamTally.feed", "feed", "infera/server/tally.py"),
    ("      upstream reads (BodyReader)", "__anext__", "infera/transport/http_wire.py"),
    ("      cycle send (uvicorn)", "send", "uvicorn/protocols/http/httptools_impl.py"),
    ("    intake (take_quick)", "take_quick", "infera/server/intake.py"),
    ("  upstream protocol data_received", "data_received", "infera/transport/http_wire.py"),
    ("  client protocol data_received", "data_received", "uvicorn/protocols/http/httptools_impl.py"),
    ("  KV events (zmq readable)", "readable", "infera/transport/zmq_events.py"),
    ("    PrefixIndex.apply", "apply", "infera/kv/index.py"),
    ("    deliver", "deliver", "infera/kv/feed.py"),
]


def threads_cpu(pid: int) -> dict[int, float]:
    """CPU seconds per thread id of ``pid`` (utime + stime)."""
    out: dict[int, float] = {}
    tck = os.sysconf("SC_CLK_TCK")
    for tdir in Path(f"/proc/{pid}/task").iterdir():
        try:
            raw = (tdir / "stat").read_text()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2:].split()
        out[int(tdir.name)] = (int(f[11]) + int(f[12])) / tck
    return out


def wakes(pid: int) -> int:
    """Voluntary context switches of all of ``pid``'s threads: each is a thread going to sleep (an event loop's
    wait for its sockets), so their count over a cell is about the loop's wake-ups."""
    total = 0
    for tdir in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (tdir / "status").read_text()
        except OSError:
            continue
        total += int(status.split("\nvoluntary_ctxt_switches:", 1)[1].split(None, 1)[0])
    return total


def infera_counters(url: str) -> dict[str, float]:
    """Relayed chunk gaps, KV-event batches, requests, from an infera frontend's /metrics."""
    _status, body = http_get(url + "/metrics", timeout=5)
    out = {"itl": 0.0, "batches": 0.0}
    for ln in body.decode(errors="replace").splitlines():
        if ln.startswith("infera_inter_token_latency_seconds_count"):
            out["itl"] += float(ln.rsplit(" ", 1)[1])
        elif ln.startswith("infera_kv_event_batches_total"):
            out["batches"] += float(ln.rsplit(" ", 1)[1])
    return out


_SEEN = {"events": 0, "reads": 0}


async def _send(session: Any, url: str, body: bytes) -> Outcome | str:
    """quality_load._send for streamed and whole answers alike, counting body reads and SSE events."""
    t0 = time.perf_counter()
    first = 0.0
    parts = []
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            async for chunk in resp.content.iter_any():
                if not first:
                    first = time.perf_counter()
                parts.append(chunk)
            t1 = time.perf_counter()
            if resp.status != 200:
                return f"{resp.status} {b''.join(parts)[:200]!r}"
    except Exception as exc:  # a failed request is counted, not fatal
        return repr(exc)
    data = b"".join(parts)
    _SEEN["reads"] += len(parts)
    usage: dict[str, Any] = {}
    if data.startswith(b"{"):
        usage = orjson.loads(data).get("usage") or {}
    else:
        if b"[DONE]" not in data[-64:]:
            return f"stream ended without [DONE]: {data[-200:]!r}"
        _SEEN["events"] += data.count(b"data: ")
        for line in data.split(b"\n"):
            if line.startswith(b"data: {") and b'"usage":{' in line:
                usage = orjson.loads(line[6:]).get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Outcome(first - t0, t1 - t0, int(usage.get("completion_tokens") or 0),
                   int(details.get("cached_tokens") or 0), int(usage.get("prompt_tokens") or 0))


@dataclasses.dataclass
class WholeWorkload(workloads.Workload):
    """The same requests, answered whole (``"stream": false``)."""

    def body(self, i: int, model: str) -> bytes:
        payload = {"model": model, "messages": self.messages[i], "max_tokens": self.max_tokens,
                   "temperature": 0.0, "stream": False}
        return json.dumps(payload, separators=(",", ":")).encode()


def _cumulative(stats: Any, name: str, suffix: str) -> float:
    return float(sum(v[3] for (f, _, n), v in stats.items() if n == name and f.endswith(suffix)))


def run(w: workloads.Workload, names: list[str], args: argparse.Namespace, tok: Path, log_dir: Path,
        peer_set: dict[str, peers.Peer], renderer: Any, prof_dir: Path | None) -> list[dict[str, Any]]:
    ids = [renderer.chat_token_ids(m) for m in w.messages]
    lim = workloads.hit_limit(w, ids)
    hot = workloads.hot_blocks(w, ids, lim["reused_blocks"])
    blocks = max(int(routing_quality.FIT * hot), 256)
    extra = ["--num-kv-blocks", str(blocks), "--max-num-seqs", "256"]
    wdir = log_dir / w.name
    os.environ["QUALITY_SPLIT_TAG"] = w.name  # the frontends' profile files name their workload
    engines = [mock_engine(f"engine-{k}", tok, routing_quality.MODEL, wdir, args.speedup, extra)
               for k in range(args.engines)]
    urls = [e.url for e in engines]
    rows: list[dict[str, Any]] = []
    routers: dict[str, Any] = {}
    whole = WholeWorkload(**{f.name: getattr(w, f.name) for f in dataclasses.fields(w)})
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready("/infera/worker", 60)
        routers = routing_quality._start_routers(names, engines, tok, wdir, peer_set)
        for rnd in range(args.rounds):
            for variant in args.variants.split(","):
                order = names[rnd % len(names):] + names[: rnd % len(names)]
                for name in order:
                    proc = routers[name]
                    infera = routing_quality.ROUTERS[name][0] == "infera"
                    asyncio.run(warm_up(proc.url, routing_quality.MODEL))
                    asyncio.run(routing_quality._reset(urls, routing_quality._infera_urls(routers)))
                    i0 = proc.cpu()
                    time.sleep(args.idle)
                    idle_rate = (proc.cpu() - i0) / args.idle
                    c0 = infera_counters(proc.url) if infera else {}
                    th0 = threads_cpu(proc.pid)
                    wakes0 = wakes(proc.pid)
                    cpu0 = proc.cpu()
                    seen0 = dict(_SEEN)
                    if prof_dir is not None and infera:
                        proc.popen.send_signal(10)  # SIGUSR1: profile the cell
                    t0 = time.monotonic()
                    cell = asyncio.run(quality_load.run_cell(proc.url, w if variant == "stream" else whole,
                                                             routing_quality.MODEL, urls, args.cell_time_limit))
                    wall = time.monotonic() - t0
                    if prof_dir is not None and infera:
                        proc.popen.send_signal(12)  # SIGUSR2: dump
                    cpu = proc.cpu() - cpu0
                    th1 = threads_cpu(proc.pid)
                    wakes1 = wakes(proc.pid)
                    c1 = infera_counters(proc.url) if infera else {}
                    n = max(len(cell["outcomes"]), 1)
                    main_tid = proc.pid
                    row = {"workload": w.name, "router": name, "variant": variant, "round": rnd,
                           "ok": len(cell["outcomes"]), "errors": len(cell["errors"]), "wall_s": wall,
                           "cpu_us": cpu / n * 1e6, "idle_us": idle_rate * wall / n * 1e6,
                           "loop_us": (th1.get(main_tid, 0) - th0.get(main_tid, 0)) / n * 1e6,
                           "other_threads_us": sum(v - th0.get(t, 0) for t, v in th1.items() if t != main_tid)
                           / n * 1e6,
                           "wakes_per_req": (wakes1 - wakes0) / n,
                           "events_per_req": (_SEEN["events"] - seen0["events"]) / n,
                           "reads_per_req": (_SEEN["reads"] - seen0["reads"]) / n,
                           "completion_tokens": sum(o.completion_tokens for o in cell["outcomes"]) / n,
                           "prompt_tokens": sum(o.prompt_tokens for o in cell["outcomes"]) / n,
                           "cached_tokens": sum(o.cached_tokens for o in cell["outcomes"]) / n}
                    if infera:
                        row["chunks_per_req"] = (c1["itl"] - c0["itl"]) / n + (1 if variant == "stream" else 0)
                        row["kv_batches_per_req"] = (c1["batches"] - c0["batches"]) / n
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    finally:
        stop_all([*routers.values(), *engines])
    return rows


def report_profiles(prof_dir: Path, rows: list[dict[str, Any]]) -> None:
    for path in sorted(prof_dir.glob("*.pstats")):
        wl, rest = path.stem.split("-", 1)
        pol, k = rest.rsplit("-", 1)
        label = {"round-robin": "round-robin", "kv-aware": "infera kv-aware"}[pol]
        cells = [r for r in rows if r["router"] == label and r["workload"] == wl]
        n = cells[int(k) - 1]["ok"] if int(k) <= len(cells) else 1
        stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
        g = json.loads(path.with_suffix(".gc.json").read_text())
        calls = sum(v[1] for v in stats.values()) / n
        print(f"\n{path.stem} ({cells[int(k) - 1]['workload']} {cells[int(k) - 1]['variant']}, {n} requests): "
              f"{calls:.0f} Python calls/request; GC {g['n']} collections, {sum(g['cpu']) / n * 1e6:.1f} µs/request")
        for label_, name, suffix in AREAS:
            print(f"  {label_:44s} {_cumulative(stats, name, suffix) / n * 1e6:9.1f}")
        top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:25]
        print("  top self time (profiled µs/request, calls/request):")
        for (f, line, fn), v in top:
            print(f"    {v[2] / n * 1e6:8.1f} {v[1] / n:8.1f}  {fn} {f.split('site-packages/')[-1]}:{line}")


def report_timers(prof_dir: Path, rows: list[dict[str, Any]]) -> None:
    """The stage timers' thread CPU per request and per call, and the KV events per request."""
    for path in sorted(prof_dir.glob("*.timers.json")):
        wl, rest = path.name.removesuffix(".timers.json").split("-", 1)
        pol, k = rest.rsplit("-", 1)
        label = {"round-robin": "round-robin", "kv-aware": "infera kv-aware"}[pol]
        cell = [r for r in rows if r["router"] == label and r["workload"] == wl][int(k) - 1]
        n = max(cell["ok"], 1)
        d = json.loads(path.read_text())
        ev = d["events"]
        print(f"\n{pol} {cell['workload']} {cell['variant']} ({n} requests): loop thread "
              f"{d['loop'] / n * 1e6:.0f} µs/req (timed), GC {d['gc'][0]} collections {d['gc'][1] / n * 1e6:.1f} "
              f"µs/req; KV batches {ev[0] / n:.2f}/req, BlockStored {ev[1] / n:.1f}/req, BlockRemoved "
              f"{ev[2] / n:.1f}/req, clears {ev[3]}, {ev[4] / max(ev[0], 1):.0f} ZMTP bytes/batch, "
              f"blocks held {ev[5] / n:+.1f}/req")
        for name, (calls, sec) in d["timers"].items():
            print(f"  {name:28s} {sec / n * 1e6:8.1f} µs/req  {calls / n:6.2f} calls/req  "
                  f"{sec / max(calls, 1) * 1e6:7.1f} µs/call")
        for name, ns in d.get("walls", {}).items():
            ns.sort()
            print(f"  {name:28s} wall {sum(ns) / n / 1e3:8.1f} µs/req  {len(ns) / n:6.2f} calls/req  median "
                  f"{ns[len(ns) // 2] / 1e3:7.1f} µs/call, p25 {ns[len(ns) // 4] / 1e3:.1f}, p75 "
                  f"{ns[3 * len(ns) // 4] / 1e3:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="tenants")
    ap.add_argument("--routers", default="round-robin,infera kv-aware,sglang cache_aware")
    ap.add_argument("--variants", default="stream,whole")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measured before each cell")
    ap.add_argument("--cell-time-limit", type=float, default=150.0)
    ap.add_argument("--no-install", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--timers", action="store_true",
                    help="time the stages (thread CPU) in each infera frontend instead of cProfile")
    args = ap.parse_args()
    from infera.kv.tokenizer import PromptRenderer

    quality_load._send = _send  # type: ignore[assignment]
    tok = default_tokenizer_dir()
    renderer = PromptRenderer.from_dir(tok)
    peer_set = peers.ensure_all(install=not args.no_install)
    names = [n for n in args.routers.split(",") if n]
    names = [n for n in names if routing_quality.ROUTERS[n][0] not in peer_set
             or peer_set[routing_quality.ROUTERS[n][0]].ok]
    chosen = args.workloads.split(",")
    wls = {w.name: w for w in workloads.build(True, args.max_tokens, args.rate)}
    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-quality-split-"))
    prof_dir: Path | None = None
    if args.profile or args.timers:
        prof_dir = log_dir / "prof"
        site = log_dir / "site"
        prof_dir.mkdir()
        site.mkdir()
        (site / "sitecustomize.py").write_text(TIMERS_SITE if args.timers else SITE)
        os.environ["QUALITY_SPLIT_PROFILE_DIR"] = str(prof_dir)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    rows: list[dict[str, Any]] = []
    for name in chosen:
        rows += run(wls[name], names, args, tok, log_dir, peer_set, renderer, prof_dir)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}  load {os.getloadavg()[0]:.1f}  "
          f"speedup {args.speedup:g}  max_tokens {args.max_tokens}")
    head = (f"{'workload':<10}{'router':<20}{'variant':<8}{'ok':>5}{'CPU µs/req':>11}{'idle':>7}{'loop thr':>9}"
            f"{'other thr':>10}{'chunks':>7}{'SSE ev':>7}{'reads':>6}{'wakes':>6}{'kv batches':>11}{'prompt':>7}"
            f"{'cached':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['workload']:<10}{r['router']:<20}{r['variant']:<8}{r['ok']:>5}{r['cpu_us']:>11.0f}"
              f"{r['idle_us']:>7.0f}{r['loop_us']:>9.0f}{r['other_threads_us']:>10.0f}"
              f"{r.get('chunks_per_req', float('nan')):>7.1f}{r['events_per_req']:>7.1f}{r['reads_per_req']:>6.1f}"
              f"{r['wakes_per_req']:>6.1f}"
              f"{r.get('kv_batches_per_req', float('nan')):>11.2f}{r['prompt_tokens']:>7.0f}{r['cached_tokens']:>7.0f}")
    if prof_dir is not None:
        (report_timers if args.timers else report_profiles)(prof_dir, rows)


if __name__ == "__main__":
    main()
