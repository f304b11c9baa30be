"""Continuous batching, as vLLM v1 schedules: running requests first, then waiting ones.

Each :meth:`Scheduler.schedule` builds one step within ``max_num_batched_tokens`` (a long
prompt is prefilled in chunks across steps) and ``max_num_seqs``. A running request that
cannot get a block preempts the most recently admitted one (recompute: its blocks are freed
and it goes back to the head of the waiting queue). Waiting requests are admitted in order;
the first one that does not fit stops admission (FCFS). A new request first looks up its
prompt in the prefix cache, capped at ``(len - 1) // block_size`` blocks because vLLM always
recomputes the last prompt token. :meth:`Scheduler.update` applies a finished step: every
request that has computed all its tokens samples one more.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from infera.engine.mock.cache import Block, BlockPool
from infera.engine.mock.hashing import extend_digests
from infera.engine.mock.sequence import Sequence


@dataclasses.dataclass(slots=True)
class StepPlan:
    rows: list[tuple[Sequence, int]]  # (request, tokens computed for it this step)
    prefill_tokens: int = 0  # uncached prompt (or recomputed) tokens in the step
    decode_rows: int = 0  # requests computing exactly their last sampled token
    kv_usage: float = 0.0  # pool usage after this step's allocations, 0..1
    preempted: int = 0


@dataclasses.dataclass(slots=True)
class StepResult:
    sampled: list[Sequence]  # requests that got one new token (including the finished ones)
    finished: list[Sequence]


class Scheduler:
    def __init__(self, pool: BlockPool, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefix_queries = 0  # tokens looked up in the prefix cache (vLLM counts per new request)
        self.prefix_hits = 0
        self.preemptions = 0

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is and release its blocks; a no-op once it finished."""
        if seq.finished:
            return
        seq.finished = True
        if seq in self.running:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        if seq.blocks:
            self.pool.free(seq.blocks)
        seq.blocks = []
        seq.num_cached_blocks = 0

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        plan = StepPlan(rows=[])
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(len(seq.tokens) - seq.num_computed, budget)
            scheduled = True
            while not self._allocate(seq, n, []):
                victim = self.running.pop()
                self._preempt(victim)
                plan.preempted += 1
                if victim is seq:
                    scheduled = False
                    break
            if not scheduled:
                break
            self._add_row(plan, seq, n)
            budget -= n
            i += 1
        if not plan.preempted:
            self._admit(plan, budget)
        plan.kv_usage = self.pool.usage
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> None:
        bs = self.pool.block_size
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit: list[Block] = []
            skip = 0
            if seq.num_computed == 0:
                extend_digests(seq.digests, seq.tokens, bs)
                hit = self.pool.lookup(seq.digests[:(len(seq.tokens) - 1) // bs])
                # KV received from a prefill worker lands in blocks without compute (PD decode).
                skip = max(0, min(seq.transferred, len(seq.tokens) - 1) - len(hit) * bs)
            n = min(len(seq.tokens) - seq.num_computed - len(hit) * bs - skip, budget)
            if not self._allocate(seq, n, hit, skip):
                break
            self.waiting.popleft()
            self.running.append(seq)
            if seq.cached_tokens < 0:
                # as vLLM's num_cached_tokens: local prefix hits plus KV received from a prefill worker
                seq.cached_tokens = len(hit) * bs + skip
                self.prefix_queries += len(seq.tokens)
                self.prefix_hits += len(hit) * bs
            self._add_row(plan, seq, n)
            budget -= n

    def _add_row(self, plan: StepPlan, seq: Sequence, n: int) -> None:
        plan.rows.append((seq, n))
        if n == 1 and (seq.num_emitted > 0 or seq.transferred) and seq.num_computed == len(seq.tokens) - 1:
            plan.decode_rows += 1
        else:
            plan.prefill_tokens += n

    def _allocate(self, seq: Sequence, n: int, hit: list[Block], skip: int = 0) -> bool:
        """Give ``seq`` the blocks for ``n`` more tokens after its prefix ``hit`` and ``skip`` transferred
        tokens; False if they are not free."""
        pool = self.pool
        bs = pool.block_size
        if not hit and not skip:  # the common decode case first: the token fits in the last block
            end = seq.num_computed + n
            if end <= len(seq.blocks) * bs and end // bs <= seq.num_cached_blocks:
                return True
        computed = seq.num_computed + len(hit) * bs + skip
        need = -(-(computed + n) // bs) - len(seq.blocks) - len(hit)
        evictable_hits = sum(1 for b in hit if b.ref_cnt == 0) if hit else 0
        if need > pool.num_free - evictable_hits:
            return False
        if hit:
            pool.touch(hit)
            seq.blocks.extend(hit)
            seq.num_cached_blocks = len(hit)
        seq.num_computed = computed
        if need > 0:
            seq.blocks.extend(pool.allocate(need))
        full = min(computed + n, len(seq.tokens)) // bs
        if full > seq.num_cached_blocks:
            extend_digests(seq.digests, seq.tokens, bs)
            pool.cache_full_blocks(seq.blocks, seq.digests, seq.tokens, seq.num_cached_blocks, full)
            seq.num_cached_blocks = full
        return True

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.num_computed = 0
        seq.transferred = 0  # the transferred KV is gone with the blocks: recompute it
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, plan: StepPlan) -> StepResult:
        """Apply a step once its (modelled) compute time has passed."""
        sampled: list[Sequence] = []
        finished: list[Sequence] = []
        for seq, n in plan.rows:
            if seq.finished:  # aborted during the step
                continue
            seq.num_computed += n
            if seq.num_computed < len(seq.tokens):
                continue  # a prefill chunk; no token yet
            seq.tokens.append(seq.output_ids[seq.num_emitted])
            seq.num_emitted += 1
            sampled.append(seq)
            if seq.done_sampling:
                seq.finished = True
                finished.append(seq)
                self._release(seq)
        if finished:
            self.running = [s for s in self.running if not s.finished]
        return StepResult(sampled=sampled, finished=finished)
