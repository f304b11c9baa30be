"""An incoming hot POST's handling, from the protocol's ``data_received`` to the handler's first line: this tree
against git ``--ref``, in process, in rounds (a child per tree, the order alternating).

The server's own protocol class (``with_lean(with_deadlines(...), LeanPath)``, uvloop) is fed a ~4 kB chat POST
with a client's usual seven headers over an in-memory socket; the lean path's endpoint is a stub that notes the
time and answers ``{}`` at once (what the handler then does is not this bench's). Per request:

- ``arrive``: thread CPU µs of ``data_received`` (httptools and every parser callback, the scope, the cycle,
  the task's creation);
- ``start``: thread CPU µs from the request's bytes to the handler's first line (``arrive`` plus the task's first
  step: ``LeanPath.run``/``serve`` up to the endpoint's call), median over the requests;
- ``frames`` / ``ops``: Python frames and bytecodes over that same stretch (``sys.settrace`` with opcode events,
  counted over ``--traced`` requests after the timed ones).

    PYTHONPATH=$PWD .venv/bin/python bench/http_arrival.py --ref main --rounds 5 --n 20000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # not first: a child's PYTHONPATH picks its infera

from harness.memsock import MemTransport  # after the path: harness is beside bench/

PATH = "/v1/chat/completions"


def request(body: bytes) -> bytes:
    head = [b"POST " + PATH.encode() + b" HTTP/1.1", b"host: 127.0.0.1:8000", b"user-agent: python-httpx/0.28.1",
            b"accept: */*", b"accept-encoding: gzip, deflate", b"connection: keep-alive",
            b"content-type: application/json", b"content-length: " + str(len(body)).encode()]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class Answers(MemTransport):
    def __init__(self) -> None:
        super().__init__()
        self.answer: asyncio.Future[bytes] | None = None

    def sent(self, data: bytes) -> None:
        if not data.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answer: {data[:300]!r}")
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(data)


async def measure(n: int, traced: int) -> dict[str, float]:
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response

    from infera.server.deadlines import with_deadlines
    from infera.server.drain import DrainState
    from infera.server.lean import LeanPath, with_lean

    started: list[float] = []
    tracing = [False]

    async def handler(request: Request) -> Response:
        started.append(time.thread_time())
        if tracing[0]:
            sys.settrace(None)
        return Response(b"{}", media_type="application/json")

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("not the lean path")

    lean = LeanPath(asgi, {PATH: handler}, DrainState(),  # type: ignore[arg-type]
                    on_error=lambda request, exc: PlainTextResponse("error", 500), telemetry=None,
                    default_worker=None)
    config = uvicorn.Config(asgi, http=with_lean(with_deadlines(10, 60), lean), log_level="warning",
                            access_log=False, proxy_headers=False, lifespan="off")
    config.load()
    server = uvicorn.Server(config)
    protocol = config.http_protocol_class(config=config, server_state=server.server_state, app_state={})
    sock = Answers()
    protocol.connection_made(sock)
    raw = request(json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 4000}],
                              "max_tokens": 8}).encode())
    arrive: list[float] = []
    start: list[float] = []
    frames = ops = 0
    by_function: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal frames
        if event != "call":
            return None
        frames += 1
        code = frame.f_code
        name = f"{Path(code.co_filename).name}:{code.co_qualname}"
        by_function[name + " (frames)"] += 1
        frame.f_trace_opcodes = True

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal ops
            if event == "opcode":
                ops += 1
                by_function[name] += 1
            return local
        return local

    loop = asyncio.get_running_loop()

    async def one(trace: bool) -> None:
        sock.answer = answer = loop.create_future()
        if trace:
            tracing[0] = True
            sys.settrace(tracer)
        t0 = time.thread_time()
        protocol.data_received(raw)
        t1 = time.thread_time()
        await answer
        if trace:
            tracing[0] = False
        else:
            arrive.append((t1 - t0) * 1e6)
            start.append((started[-1] - t0) * 1e6)
        if protocol.tasks:
            await asyncio.gather(*protocol.tasks)

    for _ in range(2000):
        await one(False)
    arrive.clear()
    start.clear()
    for _ in range(n):
        await one(False)
    for _ in range(traced):
        await one(True)
    protocol.connection_lost(None)
    arrive.sort()
    start.sort()
    if os.environ.get("HTTP_ARRIVAL_FUNCTIONS"):
        for name, count in sorted(by_function.items()):
            print(f"{count / traced:8.1f} {name}", file=sys.stderr)
    return {"arrive": arrive[n // 2], "start": start[n // 2], "frames": frames / traced, "ops": ops / traced}


def child(n: int, traced: int) -> None:
    import uvloop

    import infera
    print(json.dumps({"tree": str(Path(infera.__file__).parent.parent),
                      **uvloop.run(measure(n, traced))}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="git ref of the 'before' tree")
    ap.add_argument("--ref-tree", help="an exported, built tree to use as the ref instead of exporting --ref")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=20000, help="timed requests per tree and round")
    ap.add_argument("--traced", type=int, default=200, help="traced requests per tree and round")
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    here = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree = args.ref_tree
        if ref_tree is None:
            ref_tree = tmp
            subprocess.run(f"git -C {here} archive {args.ref} | tar -x -C {tmp}", shell=True, check=True)
            subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=tmp, check=True,
                           capture_output=True)
        trees = {"ref": ref_tree, "this": str(here)}
        results: dict[str, list[dict[str, float]]] = {"ref": [], "this": []}
        env = {**os.environ, "TOKENIZERS_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
        for r in range(args.rounds):
            for name in (("ref", "this") if r % 2 == 0 else ("this", "ref")):
                out = subprocess.run([sys.executable, __file__, "--child", str(args.n), str(args.traced)],
                                     env={**env, "PYTHONPATH": trees[name]}, check=True, capture_output=True,
                                     text=True).stdout
                got = json.loads(out.strip().splitlines()[-1])
                if Path(got.pop("tree")).resolve() != Path(trees[name]).resolve():
                    raise SystemExit(f"the {name} child imported infera from elsewhere")
                results[name].append(got)
                print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    print(f"{'':8}{'ref':>10}{'this':>10}{'ratio':>9}")
    for key in ("arrive", "start", "frames", "ops"):
        ref = sorted(x[key] for x in results["ref"])[len(results["ref"]) // 2]
        this = sorted(x[key] for x in results["this"])[len(results["this"]) // 2]
        print(f"{key:8}{ref:10.2f}{this:10.2f}{this / ref:8.3f}x")


if __name__ == "__main__":
    main()
