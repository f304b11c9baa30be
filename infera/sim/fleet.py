"""The discrete-event driver: arrivals, engine steps and late KV-event deliveries on one virtual clock.

Two heaps, both keyed by ``(time, sequence number)`` so that equal times keep their order
and every run gives the same numbers:

- *arrivals*: the trace's requests, and closed-loop turns pushed when the previous turn finishes;
- *router effects*: what the router learns, when it learns it -- a KV event batch published at
  a step's start reaches the index ``event_delay`` seconds later; a first token ends the ticket's
  prefill part and a finish ends the ticket at the step's end, as the server sees them.

The loop takes the next arrival time ``T`` (or, with closed-loop sessions, no further than the
workload's lookahead past the current time, so that no arrival can be created behind an engine's
clock), advances every engine to that horizon (each runs its steps in one tight loop; see
:mod:`infera.sim.engine`), applies the router effects due by then, and routes the arrivals due.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Any

from infera.protocols.kv_events import EventBatch
from infera.protocols.worker import Capacity
from infera.sim.engine import INF, EngineConfig, SimEngine, SimRequest, Sink
from infera.sim.routing import SimRouter, worker_ids
from infera.sim.workload import MIN_THINK, Workload

DEFAULT_EVENT_DELAY = 0.005  # seconds from an engine publishing a batch to the router applying it


@dataclasses.dataclass(slots=True)
class FleetConfig:
    workers: int = 4
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    policy: str = "kv-aware"
    kv_overlap_weight: float = 1.0
    temperature: float = 0.0
    event_delay: float = DEFAULT_EVENT_DELAY
    seed: int = 0


@dataclasses.dataclass
class RunResult:
    config: FleetConfig
    requests: list[SimRequest]
    engines: list[SimEngine]
    decisions: dict[str, int]
    end_time: float


class Simulation:
    def __init__(self, workload: Workload, config: FleetConfig) -> None:
        self.workload = workload
        self.config = config
        self.now = 0.0
        self._seq = itertools.count()
        self._arrivals: list[tuple[float, int, int, int]] = []  # (time, seq, session, turn)
        self._effects: list[tuple[float, int, int, Any, Any]] = []  # (time, seq, kind, a, b)
        eng = config.engine
        capacity = Capacity(kv_blocks=eng.num_blocks - 1, max_num_seqs=eng.max_num_seqs)  # as the mock's record
        self.router = SimRouter(config.workers, eng.block_size, config.policy, self._clock,
                                config.kv_overlap_weight, config.temperature, config.seed, capacity)
        sink = Sink(self._on_batch, self._on_first, self._on_finish)
        self.engines = [SimEngine(wid, config.engine, sink) for wid in worker_ids(config.workers)]
        self._by_id = {e.worker_id: e for e in self.engines}
        self.requests: list[SimRequest] = []
        self._session_of: dict[int, tuple[int, int]] = {}  # request index -> (session, turn)
        self._waiting_sessions: list[int] = []  # over the concurrency cap, in start order
        self._active_sessions = 0

    def _clock(self) -> float:
        return self.now

    # -- engine -> router ------------------------------------------------------------------

    def _on_batch(self, worker_id: str, at: float, batch: EventBatch) -> None:
        heapq.heappush(self._effects, (at + self.config.event_delay, next(self._seq), 0, worker_id, batch))

    def _on_first(self, req: SimRequest, at: float) -> None:
        heapq.heappush(self._effects, (at, next(self._seq), 1, req, None))

    def _on_finish(self, req: SimRequest, at: float) -> None:
        req.finished = at
        heapq.heappush(self._effects, (at, next(self._seq), 2, req, None))
        session, turn = self._session_of[req.index]
        s = self.workload.sessions[session]
        think = max(s.think, MIN_THINK)  # never less than the lookahead: no arrival behind an engine's clock
        if turn + 1 < len(s.turns):
            self._push_arrival(at + think, session, turn + 1)
        else:
            self._active_sessions -= 1
            if self._waiting_sessions:
                self._start_session(self._waiting_sessions.pop(0), at + think)

    def _apply_effects(self, until: float) -> None:
        effects = self._effects
        router = self.router
        while effects and effects[0][0] <= until:
            at, _, kind, a, b = heapq.heappop(effects)
            self.now = at
            if kind == 0:
                router.deliver(a, b)
            elif kind == 1:
                router.first_token(a.routed)
            else:
                router.finished(a.routed)

    # -- arrivals --------------------------------------------------------------------------

    def _push_arrival(self, at: float, session: int, turn: int) -> None:
        heapq.heappush(self._arrivals, (at, next(self._seq), session, turn))

    def _start_session(self, session: int, at: float) -> None:
        self._active_sessions += 1
        self._push_arrival(max(at, self.workload.sessions[session].start), session, 0)

    def _route(self, at: float, session: int, turn_no: int) -> None:
        turn = self.workload.sessions[session].turns[turn_no]
        req = SimRequest(index=len(self.requests), arrival=at, prompt_len=len(turn.prompt),
                         output_len=len(turn.output))
        self.requests.append(req)
        self._session_of[req.index] = (session, turn_no)
        routed = self.router.route(turn.prompt, len(turn.output))
        req.routed = routed
        req.worker = routed.worker_id
        req.overlap_blocks = routed.overlap_blocks
        self._by_id[routed.worker_id].submit(req, list(turn.prompt), turn.output, at)

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> RunResult:
        w = self.workload
        order = sorted(range(len(w.sessions)), key=lambda i: (w.sessions[i].start, i))
        cap = w.concurrency or len(order)
        for i in order[:cap]:
            self._start_session(i, w.sessions[i].start)
        self._waiting_sessions = order[cap:]
        lookahead = w.lookahead()
        engines = self.engines
        arrivals = self._arrivals
        while True:
            if not arrivals and not any(e.next_change < INF for e in engines):
                self._apply_effects(INF)
                break
            next_arrival = arrivals[0][0] if arrivals else INF
            horizon = min(next_arrival, self.now + lookahead)
            for e in engines:
                if e.next_change <= horizon:
                    e.advance(horizon)
            if horizon == INF:  # an open loop draining: every engine ran to idle
                continue
            self._apply_effects(horizon)
            self.now = horizon
            while arrivals and arrivals[0][0] <= horizon:
                at, _, session, turn = heapq.heappop(arrivals)
                self._route(at, session, turn)
        end = max((r.finished for r in self.requests), default=0.0)
        return RunResult(self.config, self.requests, self.engines, self.router.decisions(), end)
