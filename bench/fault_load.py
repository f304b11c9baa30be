"""Open-loop load for the reliability suite, and the verdict on every request.

Requests go out on a fixed schedule (request ``i`` at ``i / rate`` s) whatever happens to the
ones before, rotating through streamed and non-streamed OpenAI chat and Anthropic messages with
short, medium and long prompts. Each carries a unique ``x-request-id`` (the mock engines' ledger
counts duplicated work by it) and its own deadline. Every request ends in exactly one outcome:

- ``ok``: a complete answer (a stream's terminal event: ``[DONE]`` / ``message_stop``);
- ``error``: a clean error in the API's own shape, as a status (OpenAI ``{"error": {...}}``,
  Anthropic ``{"type": "error", ...}``) or as a stream's error event;
- ``refused``: the connection was refused (nothing reached a server: safe for a client to retry);
- ``aborted``: the client itself left mid-stream (the client-abort scenario);
- ``lost``: a reset or EOF with no answer, or a stream cut without a terminal or error event;
- ``hung``: no end within the deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp

OUTCOMES = ("ok", "error", "refused", "aborted", "lost", "hung")
KINDS = ("chat-stream", "chat", "messages-stream", "messages")
PROMPT_WORDS = (20, 200, 800)  # short, medium, long
_WORDS = ("route worker cache block prefix token stream engine fleet request answer retry drain lease event "
          "queue batch decode prefill latency budget tenant session").split()


@dataclasses.dataclass
class Result:
    kind: str
    rid: str
    sent_at: float  # seconds since the load started
    outcome: str = "hung"
    status: int = 0
    detail: str = ""
    took: float = 0.0
    conn: str = ""  # "new" or "reused": the connection the request went out on


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def request_for(i: int, model: str, seed: int = 5) -> tuple[str, str, dict[str, Any]]:
    """``(kind, path, body)`` of request ``i``: kinds and prompt lengths rotate, 12-96 output tokens."""
    rng = random.Random(seed * 100_003 + i)
    kind = KINDS[i % len(KINDS)]
    words = PROMPT_WORDS[(i // len(KINDS)) % len(PROMPT_WORDS)]
    messages = [{"role": "user", "content": f"tenant {i % 7}: " + _prompt(rng, words)}]
    max_tokens = rng.randint(12, 96)
    stream = kind.endswith("-stream")
    if kind.startswith("chat"):
        return kind, "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": max_tokens,
                                              "stream": stream}
    return kind, "/v1/messages", {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream}


def clean_error_body(body: bytes) -> bool:
    """An error body in OpenAI's or Anthropic's shape."""
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    err = doc.get("error")
    return isinstance(err, dict) and isinstance(err.get("message"), str)


def stream_verdict(kind: str, text: str) -> tuple[str, str]:
    """The outcome of a whole SSE body: ok (terminal event), error (error event), else lost."""
    if kind == "chat-stream":
        for line in text.splitlines():
            if line.startswith("data: {") and '"error"' in line and clean_error_body(line[6:].encode()):
                return "error", line[:200]
        return ("ok", "") if "data: [DONE]" in text else ("lost", "stream cut: " + text[-120:])
    if "event: error" in text:
        return "error", text[text.index("event: error"):][:200]
    return ("ok", "") if "event: message_stop" in text else ("lost", "stream cut: " + text[-120:])


class Load:
    """One open-loop run against ``base`` (the frontend); :meth:`run` returns every :class:`Result`."""

    def __init__(self, base: str, model: str, n: int, rate: float, deadline: float = 30.0,
                 abort_window: tuple[float, float] | None = None, seed: int = 5) -> None:
        self.base = base
        self.model = model
        self.n = n
        self.rate = rate
        self.deadline = deadline
        self.abort_window = abort_window  # streams sent in [a, b) s are left by the client after one chunk
        self.seed = seed
        self.results: list[Result] = []
        self.started = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def in_flight(self) -> int:
        return sum(1 for r in self.results if r.took == 0.0)

    async def run(self, on_tick: Callable[[float], None] | None = None) -> list[Result]:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        trace = aiohttp.TraceConfig()

        async def new_conn(session: Any, ctx: Any, params: Any) -> None:
            ctx.trace_request_ctx.conn = "new"

        async def reused(session: Any, ctx: Any, params: Any) -> None:
            ctx.trace_request_ctx.conn = "reused"

        trace.on_connection_create_end.append(new_conn)
        trace.on_connection_reuseconn.append(reused)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, trace_configs=[trace]) as session:
            self.started = time.monotonic()
            tasks = []
            for i in range(self.n):
                due = self.started + i / self.rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if on_tick is not None:
                    on_tick(self.elapsed())
                tasks.append(asyncio.ensure_future(self._one(session, i)))
            await asyncio.gather(*tasks)
        return self.results

    async def _one(self, session: aiohttp.ClientSession, i: int) -> None:
        kind, path, body = request_for(i, self.model, self.seed)
        res = Result(kind, uuid.uuid4().hex, self.elapsed())
        self.results.append(res)
        window = self.abort_window
        leave = window is not None and kind.endswith("-stream") and window[0] <= res.sent_at < window[1]
        try:
            async with asyncio.timeout(self.deadline):
                await self._send(session, path, body, res, leave)
        except TimeoutError:
            res.outcome, res.detail = "hung", f"no end within {self.deadline:g}s"
        except aiohttp.ClientConnectorError as exc:
            res.outcome, res.detail = "refused", str(exc)[:200]
        except (aiohttp.ClientError, ConnectionError) as exc:
            res.outcome, res.detail = "lost", f"{type(exc).__name__} on a {res.conn or '?'} connection: {exc}"[:200]
        res.took = max(1e-9, self.elapsed() - res.sent_at)

    async def _send(self, session: aiohttp.ClientSession, path: str, body: dict[str, Any], res: Result,
                    leave: bool) -> None:
        headers = {"x-request-id": res.rid, "content-type": "application/json"}
        async with session.post(self.base + path, data=json.dumps(body), headers=headers,
                                trace_request_ctx=res) as resp:
            res.status = resp.status
            if leave and resp.status == 200:
                await resp.content.readany()
                resp.close()  # the client goes away mid-stream
                res.outcome = "aborted"
                return
            raw = await resp.read()
        if res.status != 200:
            ok_shape = clean_error_body(raw)
            res.outcome = "error" if ok_shape else "lost"
            res.detail = raw[:200].decode("utf-8", "replace")
            return
        if res.kind.endswith("-stream"):
            res.outcome, res.detail = stream_verdict(res.kind, raw.decode("utf-8", "replace"))
            return
        try:
            doc = json.loads(raw)
            complete = bool(doc.get("choices") or doc.get("content") is not None)
        except (ValueError, AttributeError):
            complete = False
        res.outcome = "ok" if complete else "lost"
        if not complete:
            res.detail = raw[:200].decode("utf-8", "replace")


def tally(results: list[Result]) -> dict[str, int]:
    counts = Counter(r.outcome for r in results)
    return {"sent": len(results), **{o: counts.get(o, 0) for o in OUTCOMES}}
