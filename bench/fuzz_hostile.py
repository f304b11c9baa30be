"""The hostile phases of ``bench/fuzz.py``, against a live frontend: hostile bodies, 10 MB bodies, a
huge prompt, slow-drip headers and bodies, and many concurrent half-open connections; plus the
bystander client and the frontend's RSS/fd sampler that watch all of it.

Every loop here is bounded in count and time; everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import percentile
from harness.fuzz import JSON_PATHS, hostile_bodies, shaped


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Sampler:
    """The frontend's RSS (MB) and open fds, every ``every`` seconds, each sample tagged with the phase."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid, self.every = pid, every
        self.phase = "start"
        self.samples: list[tuple[float, str, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.samples.append((time.monotonic(), self.phase, rss_mb(self.pid), open_fds(self.pid)))
            self._stop.wait(self.every)

    def now(self) -> tuple[float, int]:
        return rss_mb(self.pid), open_fds(self.pid)

    def peak(self, phase: str) -> tuple[float, int]:
        rows = [s for s in self.samples if s[1] == phase]
        return (max(r[2] for r in rows), max(r[3] for r in rows)) if rows else (float("nan"), 0)


class Bystander:
    """One ordinary client sending a small chat request after another; latency and failures per phase.

    ``probe``: GET /livez instead, every 50 ms: the frontend's own responsiveness, engines aside."""

    def __init__(self, url: str, model: str, timeout: float = 30.0, probe: bool = False) -> None:
        self.url, self.model, self.timeout, self.probe = url, model, timeout, probe
        self.phase = "start"
        self.results: list[tuple[str, float, int]] = []  # phase, seconds, status (0 = no answer)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)

    def _run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hello there, bystander"}],
                "max_tokens": 8}
        with httpx.Client(base_url=self.url, timeout=self.timeout) as client:
            while not self._stop.is_set():
                phase, started = self.phase, time.perf_counter()
                try:
                    status = (client.get("/livez") if self.probe else
                              client.post("/v1/chat/completions", json=body)).status_code
                except httpx.HTTPError:
                    status = 0
                self.results.append((phase, time.perf_counter() - started, status))
                if self.probe:
                    self._stop.wait(0.05)

    def summary(self, phase: str | None = None) -> dict[str, Any]:
        rows = [r for r in self.results if phase is None or r[0] == phase]
        ok = [r[1] * 1000 for r in rows if r[2] == 200]
        return {"requests": len(rows), "failed": len(rows) - len(ok), "p50_ms": round(percentile(ok, 50), 1),
                "p99_ms": round(percentile(ok, 99), 1), "max_ms": round(max(ok, default=float("nan")), 1)}


# ---- phases ---------------------------------------------------------------------------------------------

def hostile_round(url: str, model: str, token: str, huge_chars: int) -> dict[str, Any]:
    """Every hostile body to every JSON endpoint: statuses, and answers not in the API's shape."""
    statuses: Counter[int] = Counter()
    wrong: list[str] = []
    kinds: set[str] = set()
    took: list[tuple[float, str, str, int]] = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for case in hostile_bodies(model, huge_chars=huge_chars):
            kinds.add(case.name)
            headers = {**case.headers, "authorization": f"Bearer {token}"}
            started = time.perf_counter()
            try:
                resp = client.post(case.path, content=case.body, headers=headers)
            except httpx.HTTPError as exc:
                wrong.append(f"{case.name} -> {case.path}: no answer ({exc!r})")
                continue
            took.append((round(time.perf_counter() - started, 2), case.name, case.path, resp.status_code))
            statuses[resp.status_code] += 1
            problem = shaped(case.path, resp.status_code, resp.headers.get("content-type", ""), resp.content)
            if problem:
                wrong.append(f"{case.name} -> {case.path}: {problem}")
    return {"kinds": len(kinds), "cases": sum(statuses.values()), "statuses": dict(sorted(statuses.items())),
            "wrong": wrong, "slowest": sorted(took, reverse=True)[:8]}


def ten_mb(url: str, token: str) -> dict[str, Any]:
    """A 10 MB body to every JSON endpoint, declared and chunked: each must be a 413 in the API's shape."""
    body = b'{"model": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    out: dict[str, Any] = {"cases": 0, "413": 0, "wrong": []}
    with httpx.Client(base_url=url, timeout=60) as client:
        for path in JSON_PATHS:
            for declared in (True, False):
                content: Any = body if declared else iter([body[i:i + (1 << 20)] for i in range(0, len(body),
                                                                                                  1 << 20)])
                try:
                    resp = client.post(path, content=content, headers={"content-type": "application/json",
                                                                       "authorization": f"Bearer {token}"})
                except httpx.HTTPError as exc:  # the server may close once it has refused: not a failure
                    out["wrong"].append(f"{path}: {exc!r}")
                    continue
                out["cases"] += 1
                out["413"] += resp.status_code == 413
                problem = shaped(path, resp.status_code, resp.headers.get("content-type", ""), resp.content)
                if resp.status_code != 413 or problem:
                    out["wrong"].append(f"{path}: {resp.status_code} {problem or ''}")
    return out


def huge_prompt(url: str, model: str, megabytes: float) -> dict[str, Any]:
    """A chat request and a count_tokens call with a prompt of ``megabytes``: statuses and seconds."""
    text = "the quick brown fox jumps over the lazy dog " * int(megabytes * 1024 * 1024 / 44)
    out: dict[str, Any] = {"prompt_mb": round(len(text) / 1e6, 1)}
    with httpx.Client(base_url=url, timeout=300) as client:
        for name, path, body in (
                ("chat", "/v1/chat/completions",
                 {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4}),
                ("count_tokens", "/v1/messages/count_tokens",
                 {"model": model, "messages": [{"role": "user", "content": text}]})):
            started = time.perf_counter()
            resp = client.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})
            out[name] = {"status": resp.status_code, "seconds": round(time.perf_counter() - started, 2)}
    return out


async def _drip(port: int, fast: bytes, slow: bytes, every: float, bound: float) -> tuple[bytes, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    received = asyncio.ensure_future(reader.read())
    try:
        writer.write(fast)
        for i in range(len(slow)):
            if received.done():
                break
            writer.write(slow[i:i + 1])
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            await asyncio.wait((received,), timeout=every)
        return await asyncio.wait_for(received, bound), time.monotonic() - started
    finally:
        writer.close()


def slowloris(port: int, model: str, bound: float) -> dict[str, Any]:
    """Slow-drip headers (expect the connection closed) and a slow-drip body (expect a 408)."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    headers_answer, headers_took = asyncio.run(_drip(port, head, b"x-slow: " + b"a" * 100_000, 0.2, bound))
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    full = head + f"content-length: {len(body)}\r\n\r\n".encode()
    body_answer, body_took = asyncio.run(_drip(port, full, body, 0.2, bound))
    return {"headers": {"answer": "closed" if headers_answer == b"" else headers_answer[:40].decode(errors="replace"),
                        "seconds": round(headers_took, 1)},
            "body": {"status": int(body_answer.split(b" ", 2)[1]) if body_answer else None,
                     "seconds": round(body_took, 1)}}


@dataclasses.dataclass
class HalfOpen:
    opened: int
    closed_by_server: int
    seconds_to_close: float
    fds_before: int
    fds_peak: int
    fds_after: int


def half_open(port: int, pid: int, n: int, bound: float) -> HalfOpen:
    """``n`` connections that send half a request's headers and then nothing; how the server copes."""
    fds_before = open_fds(pid)
    socks: list[socket.socket] = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        socks.append(s)
    started = time.monotonic()
    peak = open_fds(pid)
    closed = 0
    pending = list(socks)
    while pending and time.monotonic() - started < bound:
        peak = max(peak, open_fds(pid))
        still: list[socket.socket] = []
        for s in pending:
            s.settimeout(0.0)
            try:
                data = s.recv(1)
            except BlockingIOError:
                still.append(s)
                continue
            except OSError:
                data = b""
            if data == b"":
                closed += 1
            else:
                still.append(s)
        pending = still
        time.sleep(0.1)
    took = time.monotonic() - started
    for s in socks:
        s.close()
    deadline = time.monotonic() + 10
    while open_fds(pid) > fds_before + 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    return HalfOpen(n, closed, round(took, 1), fds_before, peak, open_fds(pid))
