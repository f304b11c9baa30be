"""Routing-quality workloads and their limits, built once per run so every policy gets the same requests.

  tenants  (a) many tenants, each with a long system prompt (~3k tokens), each request a unique
               question (~150 tokens); open loop, Poisson arrivals, tenants drawn at random.
  multiturn (b) conversations (a shared ~300-token app prompt + a ~1.5k-token document of their own)
               that grow each turn (user ~100 + assistant ~150 tokens); a fixed number of slots, each
               running its conversations one after another with a think time between turns. The
               assistant turns in the history are synthetic (the same for every policy), so the
               requests do not depend on which engine answered.
  unique   (c) no sharing at all: every prompt (~2k tokens) is new; closed loop, a fixed number of users.
  agentic  (d) agent sessions: a shared ~1k-token tool preamble + a task of their own, then every turn
               appends the agent's tool call (~40 tokens) and the tool's result (~250-650 tokens), so the
               context grows from ~1.5k to ~5k tokens; closed loop, all sessions at once, short think time.
  burst    (e) a fixed background of unique ~1k-token requests (open loop), and at t=1 s 40 requests at
               once on one new long (~3k-token) prefix, each with its own question.

A workload is a list of sessions (a session sends its requests one after another) with start times
and a concurrency cap. ``hit_limit`` replays the prompts through an infinite prefix cache (full blocks,
the last token never cached, as vLLM): the best hit ratio any router could reach. ``hot_blocks`` is
what must be cached at once for that limit, from which the engines' KV capacity is set.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

from bench.common import _text

BLOCK = 16


@dataclasses.dataclass
class Workload:
    name: str
    label: str
    sessions: list[list[int]]  # request indexes, sent in order within a session
    starts: list[float]  # seconds after the cell starts, per session
    think: list[float]  # seconds between the requests of a session
    concurrency: int  # sessions in progress at once, at most
    messages: list[list[dict[str, str]]]  # per request
    max_tokens: int
    params: dict[str, Any] = dataclasses.field(default_factory=dict)

    def body(self, i: int, model: str) -> bytes:
        payload = {"model": model, "messages": self.messages[i], "max_tokens": self.max_tokens,
                   "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        return json.dumps(payload, separators=(",", ":")).encode()

    @property
    def n_requests(self) -> int:
        return len(self.messages)


def _para(rng: random.Random, words: int) -> str:
    return _text(rng, words)


def tenants(n_tenants: int, n_requests: int, rate: float, max_tokens: int, seed: int = 11) -> Workload:
    rng = random.Random(seed)
    systems = []
    for t in range(n_tenants):
        r = random.Random(seed * 7_777 + t)
        rules = "\n".join(f"{k + 1}. {_para(r, 45)}" for k in range(48))
        systems.append(f"You are the assistant of tenant {t}. Policies and reference material follow.\n{rules}")
    messages, starts, clock = [], [], 0.0
    for i in range(n_requests):
        t = rng.randrange(n_tenants)
        q = f"Request {i} from a user of tenant {t}: " + _para(random.Random(seed * 31 + i), 110)
        messages.append([{"role": "system", "content": systems[t]}, {"role": "user", "content": q}])
        clock += rng.expovariate(rate)
        starts.append(clock)
    return Workload("tenants", "(a) tenants share long system prompts", [[i] for i in range(n_requests)], starts,
                    [0.0] * n_requests, 1024, messages, max_tokens,
                    {"tenants": n_tenants, "rate_per_s": rate, "requests": n_requests})


def multiturn(slots: int, conversations: int, turns: int, max_tokens: int, think: float = 0.5,
              seed: int = 12) -> Workload:
    rng = random.Random(seed)
    app = "You are a careful research assistant. " + _para(random.Random(seed), 220)
    messages: list[list[dict[str, str]]] = []
    sessions: list[list[int]] = []
    for c in range(conversations):
        r = random.Random(seed * 1_009 + c)
        doc = f"Document {c}:\n" + _para(r, 1100)
        history: list[dict[str, str]] = [{"role": "system", "content": app}]
        ids = []
        for k in range(turns):
            user = (doc + "\n\n" if k == 0 else "") + f"Question {k} of conversation {c}: " + _para(r, 70)
            history = [*history, {"role": "user", "content": user}]
            ids.append(len(messages))
            messages.append(history)
            history = [*history, {"role": "assistant", "content": _para(r, 110)}]
        sessions.append(ids)
    thinks = [think * (0.5 + rng.random()) for _ in sessions]
    return Workload("multiturn", "(b) multi-turn conversations grow", sessions, [0.0] * conversations, thinks,
                    slots, messages, max_tokens,
                    {"slots": slots, "conversations": conversations, "turns": turns, "think_s": think})


def unique(users: int, n_requests: int, max_tokens: int, seed: int = 13) -> Workload:
    messages = []
    for i in range(n_requests):
        r = random.Random(seed * 65_537 + i)
        messages.append([{"role": "system", "content": f"Session {i} {r.getrandbits(64):x}. " + _para(r, 300)},
                         {"role": "user", "content": _para(r, 1200)}])
    return Workload("unique", "(c) no sharing", [[i] for i in range(n_requests)], [0.0] * n_requests,
                    [0.0] * n_requests, users, messages, max_tokens, {"users": users, "requests": n_requests})


def agentic(n_sessions: int, turns: int, max_tokens: int, think: float = 0.1, seed: int = 14) -> Workload:
    rng = random.Random(seed)
    tools = "You are a coding agent. You call tools and read their results. Tools:\n" + "\n".join(
        f"- tool_{k}(args): {_para(random.Random(seed + k), 28)}" for k in range(24))
    messages: list[list[dict[str, str]]] = []
    sessions: list[list[int]] = []
    for s in range(n_sessions):
        r = random.Random(seed * 2_003 + s)
        history: list[dict[str, str]] = [{"role": "system", "content": tools},
                                         {"role": "user", "content": f"Task {s}: " + _para(r, 250)}]
        ids = []
        for k in range(turns):
            ids.append(len(messages))
            messages.append(history)
            call = f"Calling tool_{r.randrange(24)} for step {k}: " + _para(r, 30)
            result = f"Result of step {k} of task {s}:\n" + _para(r, r.randint(180, 480))
            history = [*history, {"role": "assistant", "content": call}, {"role": "user", "content": result}]
        sessions.append(ids)
    thinks = [think * (0.5 + rng.random()) for _ in sessions]
    return Workload("agentic", "(d) agent sessions grow by tool results", sessions, [0.0] * n_sessions, thinks,
                    n_sessions, messages, max_tokens, {"sessions": n_sessions, "turns": turns, "think_s": think})


def burst(n_burst: int, n_background: int, rate: float, max_tokens: int, seed: int = 15) -> Workload:
    rng = random.Random(seed)
    prefix = "Shared context for a sudden burst. " + _para(random.Random(seed), 2200)
    messages, starts = [], []
    clock = 0.0
    for i in range(n_background):
        r = random.Random(seed * 131 + i)
        messages.append([{"role": "system", "content": f"Background {i} {r.getrandbits(64):x}. " + _para(r, 150)},
                         {"role": "user", "content": _para(r, 600)}])
        clock += rng.expovariate(rate)
        starts.append(clock)
    for i in range(n_burst):
        messages.append([{"role": "system", "content": prefix},
                         {"role": "user", "content": f"Burst question {i}: " + _para(random.Random(seed * 7 + i), 60)}])
        starts.append(1.0)
    n = len(messages)
    return Workload("burst", "(e) a burst on one new long prefix + background", [[i] for i in range(n)], starts,
                    [0.0] * n, 1024, messages, max_tokens,
                    {"burst": n_burst, "background": n_background, "background_rate_per_s": rate})


def build(quick: bool, max_tokens: int, rate: float) -> list[Workload]:
    if quick:
        return [tenants(16, 240, rate, max_tokens), multiturn(12, 24, 5, max_tokens), unique(12, 120, max_tokens),
                agentic(24, 6, max_tokens), burst(40, 40, 8.0, max_tokens)]
    return [tenants(16, 720, rate, max_tokens), multiturn(12, 60, 6, max_tokens), unique(12, 360, max_tokens),
            agentic(24, 10, max_tokens), burst(40, 120, 8.0, max_tokens)]


# ---------------------------------------------------------------------------------------
# Limits


def nominal_order(w: Workload) -> list[int]:
    """Requests in the order they would start if every request took no time (turns after think time)."""
    keyed = []
    for s, ids in enumerate(w.sessions):
        for k, i in enumerate(ids):
            keyed.append((w.starts[s] + k * (w.think[s] + 1.0), s, k, i))
    return [i for *_, i in sorted(keyed)]


def hit_limit(w: Workload, token_ids: list[list[int]]) -> dict[str, Any]:
    """Replay through an infinite prefix cache: share of prompt tokens a cache could serve."""
    from infera.kv.hashing import block_hashes

    seen: set[int] = set()
    reused: set[int] = set()
    hit = total = 0
    for i in nominal_order(w):
        ids = token_ids[i]
        hashes = block_hashes(ids, BLOCK)[: (len(ids) - 1) // BLOCK]
        n = 0
        while n < len(hashes) and hashes[n] in seen:
            n += 1
        reused.update(hashes[:n])
        hit += n * BLOCK
        total += len(ids)
        seen.update(block_hashes(ids, BLOCK))
    return {"limit": hit / max(total, 1), "prompt_tokens": total, "reused_blocks": len(reused),
            "mean_prompt_tokens": total / max(len(token_ids), 1)}


def hot_blocks(w: Workload, token_ids: list[list[int]], reused_blocks: int) -> int:
    """Blocks that must stay cached at once to reach the limit.

    tenants: every tenant's system prompt (all are hot all the time) = the reused blocks.
    multiturn: the live conversations' contexts: slots x the mean prompt length (blocks).
    unique: nothing is reused; what is in flight at once: users x the mean prompt length.
    agentic: as multiturn (every session is live at once).
    burst: the burst's prefix once per engine it may land on (4) plus the background in flight.
    """
    if w.name == "burst":
        return 4 * reused_blocks + 64 * 50
    if w.name in ("multiturn", "unique", "agentic"):
        mean_blocks = sum(len(t) for t in token_ids) / max(len(token_ids), 1) / BLOCK
        return int(w.concurrency * mean_blocks)
    return reused_blocks
