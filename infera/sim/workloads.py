"""The bench's workload shapes in token ids, plus agentic sessions and a burst.

Pure functions of their arguments and a seed (no tokenizer): token ids are drawn from a
seeded RNG, lengths are those of bench/workloads.py in tokens. The live bench can build the
same requests by sending each turn's ``prompt`` as token ids to ``/v1/completions``.

  tenants    many tenants with a long system prompt each, unique questions; open loop, Poisson.
  multiturn  conversations (shared app prompt + own document) growing each turn; closed loop, slots.
  unique     nothing shared; closed loop, a fixed number of users.
  agentic    closed-loop agent sessions: each turn appends the model's tool call and the tool's
             result (hundreds to thousands of tokens) to a context that keeps growing.
  burst      40 requests at once on one new long prefix, over a background of tenant traffic.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from infera.sim.workload import Session, Turn, Workload

VOCAB = 1 << 17


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def tenants(n_tenants: int = 16, n_requests: int = 720, rate: float = 20.0, max_tokens: int = 64,
            seed: int = 11) -> Workload:
    rng = random.Random(seed)
    systems = [_tokens(random.Random(seed * 7_777 + t), 3000) for t in range(n_tenants)]
    sessions, clock = [], 0.0
    for _ in range(n_requests):
        t = rng.randrange(n_tenants)
        clock += rng.expovariate(rate)
        sessions.append(Session(clock, [Turn(systems[t] + _tokens(rng, 150), _tokens(rng, max_tokens))]))
    return Workload("tenants", "(a) tenants share long system prompts", sessions,
                    params={"tenants": n_tenants, "requests": n_requests, "rate_per_s": rate})


def multiturn(slots: int = 12, conversations: int = 60, turns: int = 6, max_tokens: int = 150, think: float = 0.5,
              seed: int = 12) -> Workload:
    rng = random.Random(seed)
    app = _tokens(random.Random(seed), 300)
    sessions = []
    for c in range(conversations):
        r = random.Random(seed * 1_009 + c)
        history = app + _tokens(r, 1500)
        out = []
        for _ in range(turns):
            prompt = history + _tokens(r, 100)
            reply = _tokens(r, max_tokens)
            out.append(Turn(prompt, reply))
            history = prompt + reply
        sessions.append(Session(0.0, out, think * (0.5 + rng.random())))
    return Workload("multiturn", "(b) multi-turn conversations grow", sessions, concurrency=slots,
                    params={"slots": slots, "conversations": conversations, "turns": turns, "think_s": think})


def unique(users: int = 12, n_requests: int = 360, max_tokens: int = 64, seed: int = 13) -> Workload:
    sessions = []
    for i in range(n_requests):
        r = random.Random(seed * 65_537 + i)
        sessions.append(Session(0.0, [Turn(_tokens(r, 2000), _tokens(r, max_tokens))], think=0.01))
    return Workload("unique", "(c) no sharing", sessions, concurrency=users,
                    params={"users": users, "requests": n_requests})


def agentic(sessions: int = 24, turns: int = 12, system: int = 2000, max_tokens: int = 80,
            seed: int = 14) -> Workload:
    """Agents sharing one system prompt (tools described); each turn adds a tool call and its result."""
    rng = random.Random(seed)
    shared = _tokens(random.Random(seed), system)
    out = []
    for s in range(sessions):
        r = random.Random(seed * 4_099 + s)
        history = shared + _tokens(r, 200)  # the task
        session = []
        for _ in range(turns):
            call = _tokens(r, max_tokens)
            session.append(Turn(history, call))
            history = history + call + _tokens(r, r.randint(100, 800))  # the tool's result
        out.append(Session(rng.uniform(0.0, 2.0), session, think=rng.uniform(0.1, 0.6)))  # tool latency
    return Workload("agentic", "(d) agent sessions grow with tool results", out,
                    params={"sessions": sessions, "turns": turns, "system_tokens": system})


def burst(n_burst: int = 40, prefix: int = 4000, background: int = 300, rate: float = 10.0, at: float = 5.0,
          max_tokens: int = 64, seed: int = 15, spread: float = 0.0) -> Workload:
    """``n_burst`` requests at ``at`` seconds on one new long prefix, over Poisson tenant traffic.

    ``spread`` > 0: the burst's arrivals are evenly spaced over that many seconds instead (as a
    router that handles the simultaneous requests one after another lets them reach the engines).
    """
    base = tenants(8, background, rate, max_tokens, seed)
    r = random.Random(seed * 31)
    hot = _tokens(r, prefix)
    sessions = base.sessions + [Session(at + spread * i / n_burst,
                                        [Turn(hot + _tokens(r, 100), _tokens(r, max_tokens))]) for i in range(n_burst)]
    if spread:
        return Workload("burst-spread", f"(e') {n_burst} requests on one new prefix within {spread * 1000:.0f} ms "
                        "+ background", sessions, params={"burst": n_burst, "prefix_tokens": prefix,
                                                           "background": background, "rate_per_s": rate,
                                                           "spread_s": spread})
    return Workload("burst", f"(e) {n_burst} requests at once on one new prefix + background", sessions,
                    params={"burst": n_burst, "prefix_tokens": prefix, "background": background, "rate_per_s": rate})


BUILDERS: dict[str, Callable[[bool, int], Workload]] = {
    "tenants": lambda quick, seed: tenants(n_requests=240 if quick else 720, seed=11 + seed),
    "multiturn": lambda quick, seed: multiturn(conversations=24 if quick else 60, turns=5 if quick else 6,
                                               seed=12 + seed),
    "unique": lambda quick, seed: unique(n_requests=120 if quick else 360, seed=13 + seed),
    "agentic": lambda quick, seed: agentic(sessions=24, turns=6 if quick else 12, seed=14 + seed),
    "burst": lambda quick, seed: burst(background=100 if quick else 300, seed=15 + seed),
    # the live bench's burst reaches the engines over ~0.3 s: the router routes one request at a time
    "burst-spread": lambda quick, seed: burst(background=100 if quick else 300, seed=15 + seed, spread=0.3),
}


def build(name: str, quick: bool = False, seed: int = 0) -> Workload:
    if name not in BUILDERS:
        raise ValueError(f"unknown workload {name!r} (known: {', '.join(BUILDERS)})")
    return BUILDERS[name](quick, seed)
