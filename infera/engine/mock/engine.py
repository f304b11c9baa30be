"""The engine core: an asyncio task that runs scheduler steps and sleeps their modelled time.

Each step: schedule (allocate blocks, record KV events), publish the step's events as one
batch, sleep the step's modelled duration, then apply it (sample one token per request that
caught up, finish and free the done ones) and wake the requests' handles. The loop sleeps
on an event when there is no work, so an idle engine costs no CPU. Step times run on a
deadline clock: steps shorter than the loop's timer resolution (1 ms) run back to back
until the clock is a quantum ahead, then sleep, so the simulated throughput holds on
average at any speedup ratio while the engine yields to the HTTP side once per quantum.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence as SequenceOf
from typing import TYPE_CHECKING

from infera.engine.mock.cache import BlockPool
from infera.engine.mock.faults import Faults
from infera.engine.mock.metrics import EngineMetrics
from infera.engine.mock.publisher import KvEventPublisher
from infera.engine.mock.scheduler import Scheduler, StepPlan
from infera.engine.mock.sequence import Sequence
from infera.engine.mock.text import PlannedOutput
from infera.engine.mock.timing import StepTimeModel
from infera.protocols.kv_events import KvEvent

if TYPE_CHECKING:
    from infera.engine.mock.profiler import StepProfiler

log = logging.getLogger(__name__)

MAX_LAG_S = 0.05  # never try to catch up more than this much lost time
QUANTUM_S = 0.001  # uvloop's timer resolution: shorter steps run back to back, yielding once per quantum


class RequestHandle:
    """What a request's HTTP handler waits on. Streaming handles wake on every new token."""

    __slots__ = ("_wake", "done", "output", "sent", "seq")

    def __init__(self, seq: Sequence, output: PlannedOutput, stream: bool) -> None:
        self.seq = seq
        self.output = output
        self.sent = 0  # tokens already handed to the client
        self._wake = asyncio.Event() if stream else None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        self.notify()

    async def wait_tokens(self) -> tuple[int, int, bool]:
        """Wait for new tokens; returns ``(start, end, finished)`` as token indexes into the output."""
        assert self._wake is not None, "not a streaming handle"
        while self.seq.num_emitted <= self.sent and not self.seq.finished:
            self._wake.clear()
            await self._wake.wait()
        start, self.sent = self.sent, self.seq.num_emitted
        return start, self.sent, self.seq.finished


class Engine:
    def __init__(self, pool: BlockPool, scheduler: Scheduler, timing: StepTimeModel, metrics: EngineMetrics,
                 publisher: KvEventPublisher | None) -> None:
        self.pool = pool
        self.scheduler = scheduler
        self.timing = timing
        self.metrics = metrics
        self.publisher = publisher
        self.steps = 0
        self.profiler: StepProfiler | None = None  # records a window of steps while active
        self.faults = Faults()  # the reliability suite's knobs (slowdown, hang, publisher stall)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.publisher is not None:
            self.publisher.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="mock-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.publisher is not None:
            await self.publisher.stop()

    def blocks_needed(self, total_tokens: int) -> int:
        return -(-total_tokens // self.pool.block_size)

    def fits(self, total_tokens: int) -> bool:
        """Whether a request of this many tokens (prompt + output) can ever fit in the cache alone."""
        return self.blocks_needed(total_tokens) <= self.pool.num_usable

    def submit(self, request_id: str, prompt_ids: list[int], output: PlannedOutput, *, stream: bool,
               transferred: int = 0) -> RequestHandle:
        """Queue a request; ``transferred`` leading prompt tokens arrive as KV from a prefill worker."""
        loop = asyncio.get_running_loop()
        seq = Sequence(request_id=request_id, tokens=list(prompt_ids), output_ids=output.ids, arrival=loop.time(),
                       transferred=transferred)
        handle = RequestHandle(seq, output, stream)
        seq.owner = handle
        self.scheduler.add(seq)
        self._wake.set()
        return handle

    def abort(self, handle: RequestHandle) -> None:
        if not handle.seq.finished:
            self.scheduler.abort(handle.seq)
            handle.finish()

    def publish_pending(self, extra: SequenceOf[KvEvent] = ()) -> None:
        """Publish KV events made between steps (a kvd prewarm) now, as one batch: the pool's
        pending events first, then ``extra``. Same thread as the step loop, so order holds."""
        events = [*self.pool.take_events(), *extra]
        if events and self.publisher is not None:
            self.publisher.publish(events)

    def faults_changed(self) -> None:
        """Apply the publisher knob: a stalled publisher holds its batches, a resumed one sends them."""
        if self.publisher is not None:
            self.publisher.hold(self.faults.kv_events_paused)

    def reset_prefix_cache(self) -> bool:
        """vLLM's reset: refused while any request holds blocks; AllBlocksCleared goes out with the next step."""
        return self.pool.reset()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        sched = self.scheduler
        deadline = last_yield = loop.time()
        while True:
            if not sched.has_work():
                self._wake.clear()
                await self._wake.wait()
                deadline = last_yield = loop.time()
                continue
            if self.faults.hang:  # hung: no step runs, every stream stalls where it is
                await self.faults.wait_running()
                deadline = last_yield = loop.time()
            plan = sched.schedule()
            self.steps += 1
            events = self.pool.take_events()
            if events and self.publisher is not None:
                self.publisher.publish(events)
            if plan.preempted:
                self.metrics.preempt.inc(plan.preempted)
            if not plan.rows:  # nothing fits right now; wait for a change rather than spin
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.05)
                continue
            dt = self.timing.step_seconds(plan.prefill_tokens, plan.decode_rows, plan.kv_usage) * self.faults.slowdown
            now = loop.time()
            deadline = max(deadline + dt, now - MAX_LAG_S)
            if self.profiler is not None and self.profiler.active:
                self.profiler.record(self.steps, deadline - dt, dt, len(plan.rows), plan.prefill_tokens,
                                     plan.decode_rows, plan.kv_usage, plan.preempted)
            if deadline - now >= QUANTUM_S:
                await asyncio.sleep(deadline - now)
                last_yield = loop.time()
                self._apply(plan, last_yield)
                continue
            # The step is shorter than the event loop can sleep: apply it now and carry on with
            # the next one, yielding to the HTTP side once per quantum. Tokens of the steps run
            # in one quantum reach their streams together (one write instead of one per token).
            self._apply(plan, now)
            if now - last_yield >= QUANTUM_S:
                await asyncio.sleep(0)
                last_yield = loop.time()

    def _apply(self, plan: StepPlan, now: float) -> None:
        result = self.scheduler.update(plan)
        metrics = self.metrics
        for seq in result.sampled:
            if seq.num_emitted == 1:
                seq.first_token_at = now
                metrics.ttft.observe(now - seq.arrival)
                metrics.queries.inc(seq.prompt_len)
                metrics.hits.inc(max(0, seq.cached_tokens))
            seq.owner.notify()
        for seq in result.finished:
            handle = seq.owner
            metrics.finished(handle.output.finish_reason, seq.prompt_len, seq.num_emitted, now - seq.arrival)
            handle.finish()
