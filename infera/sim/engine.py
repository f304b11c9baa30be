"""One simulated engine: the mock engine's own scheduler, block pool and step timing, in virtual time.

:class:`SimEngine` does what ``infera.engine.mock.engine.Engine._run`` does per step --
schedule, publish the pool's KV events as one batch, take the modelled step time, apply
the step -- but on a virtual clock and lazily: :meth:`advance` runs the engine's steps up to
a horizon in one tight loop, with no event per step. That is sound because an engine's
state changes only through its own steps and the requests routed to it, and the driver never
routes a request at a time the engine has already passed (see :mod:`infera.sim.fleet`).
A step that starts before the horizon and ends after it stays pending; a request submitted
meanwhile joins the next step, as it would on the real engine. A run of decode-only steps that
cannot differ (nothing waiting, no block filled or allocated, nobody finishing) is applied in
one go (:meth:`SimEngine._fast_forward`), with the same numbers as stepping it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from infera.engine.mock.cache import BlockPool
from infera.engine.mock.scheduler import Scheduler, StepPlan
from infera.engine.mock.sequence import Sequence
from infera.engine.mock.timing import StepTimeModel
from infera.protocols.kv_events import EventBatch

INF = float("inf")


@dataclasses.dataclass(slots=True)
class EngineConfig:
    num_blocks: int = 2048
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    timing: StepTimeModel = dataclasses.field(default_factory=StepTimeModel)
    fast_forward: bool = True  # apply runs of identical decode-only steps in one go (same results)


@dataclasses.dataclass(eq=False, slots=True)
class SimRequest:
    """One request's life in the simulator (the owner of its mock :class:`Sequence`)."""

    index: int
    arrival: float
    prompt_len: int
    output_len: int
    worker: str = ""
    routed: Any = None  # the router's record (infera.sim.routing.Routed)
    overlap_blocks: int = 0
    admitted: float = -1.0  # first scheduled
    first_token: float = -1.0
    finished: float = -1.0
    cached_tokens: int = 0  # engine-counted prefix-cache hit
    preemptions: int = 0
    rejected: bool = False


class Sink:
    """What an engine tells the driver about: published event batches, first tokens, finishes."""

    def __init__(self, on_batch: Callable[[str, float, EventBatch], None],
                 on_first: Callable[[SimRequest, float], None],
                 on_finish: Callable[[SimRequest, float], None]) -> None:
        self.on_batch = on_batch
        self.on_first = on_first
        self.on_finish = on_finish


class SimEngine:
    def __init__(self, worker_id: str, config: EngineConfig, sink: Sink) -> None:
        self.worker_id = worker_id
        self.pool = BlockPool(config.num_blocks, config.block_size)
        self.scheduler = Scheduler(self.pool, config.max_num_seqs, config.max_num_batched_tokens)
        self.timing = config.timing
        self.fast_forward = config.fast_forward
        self.sink = sink
        self.clock = 0.0  # when the engine is free to start its next step
        self.pending: tuple[StepPlan, float] | None = None  # a step in progress and its end time
        self.steps = 0
        self.busy_seconds = 0.0
        self.running_seconds = 0.0  # integral of running requests over time (for the time average)
        self.tokens_served = 0  # prompt + output tokens of the requests routed here

    @property
    def next_change(self) -> float:
        """The earliest virtual time at which advancing could do anything."""
        if self.pending is not None:
            return self.pending[1]
        return self.clock if self.scheduler.has_work() else INF

    def submit(self, req: SimRequest, prompt: list[int], output_ids: list[int], now: float) -> None:
        seq = Sequence(request_id=str(req.index), tokens=prompt, output_ids=output_ids, arrival=now)
        seq.owner = req
        self.tokens_served += req.prompt_len + req.output_len
        if -(-(len(prompt) + len(output_ids)) // self.pool.block_size) > self.pool.num_usable:
            req.rejected = True  # could never fit, as Engine.fits refuses it
            self.sink.on_finish(req, now)
            return
        self.scheduler.add(seq)
        if self.pending is None and self.clock < now:
            self.clock = now  # was idle

    def advance(self, horizon: float) -> None:
        """Run steps until the engine is idle or its next step would start at or after ``horizon``.

        A step starting exactly at ``horizon`` waits, so that a request arriving then joins it.
        """
        sched = self.scheduler
        timing = self.timing
        while True:
            pending = self.pending
            if pending is not None:
                plan, end = pending
                if end > horizon:
                    return
                self.pending = None
                self.clock = end
                self._apply(plan, end)
            if self.clock >= horizon or not sched.has_work():
                return
            if self.fast_forward and not sched.waiting and self._fast_forward(horizon):
                continue
            start = self.clock
            plan = sched.schedule()
            self.steps += 1
            events = self.pool.take_events()
            if events:
                self.sink.on_batch(self.worker_id, start, EventBatch(ts=start, events=events))
            if not plan.rows:
                self._reject_head(start)
                continue
            for seq, _n in plan.rows:
                req = seq.owner
                if req.admitted < 0:
                    req.admitted = start
            dt = timing.step_seconds(plan.prefill_tokens, plan.decode_rows, plan.kv_usage)
            self.busy_seconds += dt
            self.running_seconds += dt * len(plan.rows)
            self.pending = (plan, start + dt)

    def _fast_forward(self, horizon: float) -> bool:
        """Apply ``m >= 2`` decode-only steps at once when they are certain to be identical.

        With nothing waiting and every running request decoding, a step allocates no block,
        caches no block (so publishes no event), samples one token per request and takes the
        same time (the pool's usage does not change), until some request fills its last block
        or is one token from its end. The scheduler would do exactly the same, step by step;
        the steps that remain before the horizon, a block boundary or a finish run normally.
        """
        running = self.scheduler.running
        if not running:
            return False
        bs = self.pool.block_size
        m = 1 << 30
        for seq in running:
            computed = seq.num_computed
            if computed != len(seq.tokens) - 1 or not (seq.num_emitted or seq.transferred):
                return False  # still prefilling
            # the next steps compute tokens computed+1..: stay inside allocated, not-yet-full blocks
            room = min(len(seq.blocks) * bs, (seq.num_cached_blocks + 1) * bs - 1) - computed
            left = len(seq.output_ids) - seq.num_emitted - 1
            m = min(m, room, left)
            if m < 2:
                return False
        dt = self.timing.step_seconds(0, len(running), self.pool.usage)
        if dt <= 0:
            return False
        # the clocks add dt step by step, as the step-by-step path does, so both give equal numbers
        clock, busy, run_s, rows, k = self.clock, self.busy_seconds, self.running_seconds, len(running), 0
        while k < m and clock + dt <= horizon:
            clock += dt
            busy += dt
            run_s += dt * rows
            k += 1
        if k < 2:
            return False
        for seq in running:
            e = seq.num_emitted
            seq.tokens.extend(seq.output_ids[e:e + k])
            seq.num_emitted = e + k
            seq.num_computed += k
        self.steps += k
        self.clock, self.busy_seconds, self.running_seconds = clock, busy, run_s
        return True

    def _apply(self, plan: StepPlan, now: float) -> None:
        result = self.scheduler.update(plan)
        sink = self.sink
        for seq in result.sampled:
            if seq.num_emitted == 1:
                req = seq.owner
                req.first_token = now
                req.cached_tokens = max(0, seq.cached_tokens)
                sink.on_first(req, now)
        for seq in result.finished:
            req = seq.owner
            req.preemptions = seq.preemptions
            sink.on_finish(req, now)

    def _reject_head(self, now: float) -> None:
        """Nothing fits and nothing runs: the head request can never be admitted; drop it."""
        sched = self.scheduler
        if sched.running or not sched.waiting:
            raise RuntimeError(f"{self.worker_id}: an empty step with {len(sched.running)} running")
        seq = sched.waiting[0]
        sched.abort(seq)
        seq.owner.rejected = True
        self.sink.on_finish(seq.owner, now)
