"""The lean path's Python, in process and without sockets: infera at git ``--ref`` vs this tree, in rounds.

Each round runs, for each tree in turn (the order alternating), a child process that builds the round-robin
frontend as ``python -m infera.server`` does (``build`` + ``server_for``, uvloop; one mock engine, shared, for
discovery only), then takes the network out of the request's way: the router's request transport is swapped
for an in-memory worker that answers a whole chat completion at once (its body in hand, as the HTTP transport
hands over the usual small answer), and requests are fed straight to a protocol instance of the server's own
class over an in-memory socket. What is left is the frontend's Python per request, seam by seam:

- ``path``: wall µs from the request's bytes given to the protocol to the answer's write (the critical path:
  parse, intake, place, send to the worker, collect, answer), median over the requests;
- ``cpu``: process CPU µs per request over the measured requests (the path plus what follows the write: the
  accounting, the task's end);
- ``place``: ``router.dispatch`` alone (placement, the leg, the first chunk) on a parsed request, µs;
- ``collect``: ``collect_or_disconnect`` of a whole answer in hand, µs;
- ``id``: a request id made for a request without one (``take_id``), µs.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/lean_seams.py --ref main --rounds 5 --n 20000
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # not first: a child's PYTHONPATH picks its infera

from harness.memsock import MemTransport  # after the path: harness is beside bench/

MODEL = "bench-model"
SEAMS = ("path", "cpu", "place", "collect", "id")


class MemSocket(MemTransport):
    """The client's connection, in memory: each write completes the answer being waited for."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: asyncio.Future[bytes] | None = None

    def sent(self, data: bytes) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(data)


class WholeBody:
    """A body whose one chunk is in hand (the HTTP transport's ``_Body`` over a reader at its end)."""

    def __init__(self, data: bytes) -> None:
        self.data: bytes | None = data

    def __aiter__(self) -> WholeBody:
        return self

    async def __anext__(self) -> bytes:
        data, self.data = self.data, None
        if data is None:
            raise StopAsyncIteration
        return data

    def close(self) -> None:
        pass

    def drain(self) -> bytes:
        return b""

    def ended(self) -> bool:
        return self.data is None


class MemWorker:
    """A request transport whose worker answers at once with a whole chat completion."""

    def __init__(self, answer: bytes) -> None:
        from infera.transport.base import UpstreamResponse

        self._answer = answer
        self._make = UpstreamResponse
        self._ended = "ended" in {f.name for f in dataclasses.fields(UpstreamResponse)}  # the ref may have none

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, worker: Any, path: str, body: bytes, headers: Mapping[str, str],
                   started: float | None = None) -> Any:
        content = WholeBody(self._answer)
        extra = {"ended": content.ended} if self._ended else {}
        return self._make(status=200, content_type="application/json", body=content, close=content.close,
                          drain=content.drain, **extra)


def chat_answer() -> bytes:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "one two three four"},
                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 1000, "completion_tokens": 8, "total_tokens": 1008}}).encode()


async def _path(server: Any, raws: list[bytes], warmup: int, n: int) -> dict[str, float]:
    config = server.config
    protocol = config.http_protocol_class(config=config, server_state=server.server_state,
                                          app_state=server.lifespan.state)
    sock = MemSocket()
    protocol.connection_made(sock)
    loop = asyncio.get_running_loop()
    times: list[float] = []

    async def one(raw: bytes) -> float:
        sock.answer = answer = loop.create_future()
        started = time.perf_counter()
        protocol.data_received(raw)
        head = await answer
        took = time.perf_counter() - started
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer: {head[:300]!r}")
        if protocol.tasks:  # the request's task ends (its accounting) before the next request
            await asyncio.gather(*protocol.tasks)
        return took

    for i in range(warmup):
        await one(raws[i % len(raws)])
    cpu0 = time.process_time()
    for i in range(n):
        times.append(await one(raws[i % len(raws)]))
    cpu = time.process_time() - cpu0
    protocol.connection_lost(None)
    times.sort()
    return {"path": times[n // 2] * 1e6, "cpu": cpu / n * 1e6}


async def _place(router: Any, bodies: list[bytes], n: int) -> float:
    import orjson

    from infera.router.router import RouteRequest

    reqs = [RouteRequest(kind="chat", path="/v1/chat/completions", body=b, payload=orjson.loads(b), model=MODEL,
                         max_tokens=8) for b in bodies]
    times = []
    for i in range(n):
        req = reqs[i % len(reqs)]
        started = time.perf_counter()
        routed = await router.dispatch(req, {"content-type": "application/json"})
        took = time.perf_counter() - started
        routed.close()
        times.append(took)
    times.sort()
    return times[n // 2] * 1e6


async def _collect(router: Any, bodies: list[bytes], n: int) -> float:
    import orjson

    from infera.router.router import RouteRequest
    from infera.server.relay import ClientWatch, Disconnects, collect_or_disconnect

    req = RouteRequest(kind="chat", path="/v1/chat/completions", body=bodies[0], payload=orjson.loads(bodies[0]),
                       model=MODEL, max_tokens=8)

    async def never() -> Any:
        raise AssertionError("the watch reads no receive() with the protocol's Disconnects")

    times = []
    for _ in range(n):
        routed = await router.dispatch(req, {"content-type": "application/json"})
        watch = ClientWatch(never, Disconnects())
        started = time.perf_counter()
        got = await collect_or_disconnect(watch, routed)
        times.append(time.perf_counter() - started)
        assert got
    times.sort()
    return times[n // 2] * 1e6


def _ids(n: int) -> float:
    from infera.server.request_id import take_id

    headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"4000")]
    started = time.perf_counter()
    for _ in range(n):
        take_id(headers)
    return (time.perf_counter() - started) / n * 1e6


def child(engine_url: str, warmup: int, n: int) -> None:
    import uvloop

    from bench.common import chat_body
    from harness import free_port, frontend_argv
    from infera.config import load
    from infera.config.server import ServerSettings
    from infera.server.__main__ import build, server_for

    port = free_port()
    argv = frontend_argv(port, [engine_url], policy="round-robin", args=("--log-level", "warning"))[3:]
    settings = load(ServerSettings, argv, {})
    bodies = [chat_body(i, MODEL, False, 8) for i in range(400)]
    raws = [b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(b)).encode() + b"\r\n\r\n" + b for b in bodies]

    async def main() -> dict[str, float]:
        app = build(settings)
        router = app.state.router
        server = server_for(app, settings)
        task = asyncio.ensure_future(server.serve())
        try:
            deadline = time.monotonic() + 60
            while not (server.started and router.view.has_workers()):  # the fleet view has the engine
                assert not task.done() and time.monotonic() < deadline, "the frontend did not start"
                await asyncio.sleep(0.05)
            router._legs._transport = MemWorker(chat_answer())  # the network out of the way (module docstring)
            out = await _path(server, raws, warmup, n)
            out["place"] = await _place(router, bodies, n)
            out["collect"] = await _collect(router, bodies, min(n, 5000))
            out["id"] = _ids(n)
            return out
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)

    import infera

    print(json.dumps({**uvloop.run(main()), "infera": str(Path(infera.__file__).parent)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="git ref of the 'before' frontend")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=20000, help="measured requests per tree per round")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    from bench.common import PYTHON, REPO, default_tokenizer_dir, export_ref, median, mock_engine, stop_all

    log_dir = Path(tempfile.mkdtemp(prefix="infera-bench-lean-seams-"))
    base = export_ref(args.ref, log_dir / "base")  # with its own C extensions
    trees = {args.ref: (f"{base}{os.pathsep}{REPO}", base / "infera"), "branch": (str(REPO), REPO / "infera")}
    engine = mock_engine("engine", default_tokenizer_dir(), MODEL, log_dir)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        engine.start()
        engine.wait_ready("/infera/worker", 60)
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for name in order:
                path, want = trees[name]
                out = subprocess.run([PYTHON, __file__, "--child", engine.url, str(args.warmup), str(args.n)],
                                     env={**os.environ, "PYTHONPATH": path}, check=True, capture_output=True,
                                     text=True).stdout
                result = json.loads(out.strip().splitlines()[-1])
                got = Path(result.pop("infera"))
                if got != want:  # an A/B of one tree against itself says nothing
                    raise SystemExit(f"the {name} child imported infera from {got} instead of {want}")
                results[name].append(result)
            print(f"round {r}: " + "; ".join(f"{k} " + " ".join(f"{s} {v[-1][s]:.1f}" for s in SEAMS)
                                            for k, v in results.items()), flush=True)
    finally:
        stop_all([engine])
    load1 = os.getloadavg()[0]
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.rounds} rounds x {args.n} requests, "
          f"ref {args.ref}, load {load1:.2f}; µs, medians over rounds (ratio: branch / ref)")
    print("| seam | " + " | ".join(trees) + " | ratio |")
    print("|---|" + "--:|" * (len(trees) + 1))
    for seam in SEAMS:
        cells = [median([x[seam] for x in results[name]]) for name in trees]
        print(f"| {seam} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {cells[-1] / cells[0]:.3f}x |")


if __name__ == "__main__":
    main()
