"""What the simulator replays: sessions of turns, each turn a prompt of token ids and its output.

A session sends its turns one after another: the first at ``start``, each next one ``think``
seconds after the previous one finished (closed loop). An open-loop trace is one session per
request. ``concurrency`` caps the sessions in progress at once (0 = no cap); a session over the
cap starts ``think`` after a running one ends. Every generator is a pure function of its
arguments and seed, so any policy (and the live bench) gets the same requests.

A turn's ``output`` is the exact token ids the engine will generate; a multi-turn generator puts
the same ids in the next turn's history, so a cache holding the reply serves it, as a real one would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

MIN_THINK = 0.001  # seconds; a shorter think is taken as this (the driver needs a positive lookahead)


@dataclasses.dataclass(slots=True)
class Turn:
    prompt: list[int]
    output: list[int]


@dataclasses.dataclass(slots=True)
class Session:
    start: float
    turns: list[Turn]
    think: float = 0.0


@dataclasses.dataclass
class Workload:
    name: str
    label: str
    sessions: list[Session]
    concurrency: int = 0
    params: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def n_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def lookahead(self) -> float:
        """The least virtual time between a finish and the arrival it causes (inf for open loops)."""
        closed = [s.think for s in self.sessions if len(s.turns) > 1]
        if self.concurrency and self.concurrency < len(self.sessions):
            closed += [s.think for s in self.sessions]
        return max(MIN_THINK, min(closed)) if closed else float("inf")

    def turns_in_order(self) -> list[Turn]:
        """Every turn, sessions in start order (the order a replay of the limits uses)."""
        order = sorted(range(len(self.sessions)), key=lambda i: (self.sessions[i].start, i))
        return [t for i in order for t in self.sessions[i].turns]
