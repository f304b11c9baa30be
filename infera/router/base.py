"""The policy seam: policies score candidates; the router owns every invariant.

A policy sees the request's :class:`RoutingContext` and the healthy candidates of the
right model and role, and returns one cost per candidate (lower is better) and a short
reason. Filtering, load accounting, tie-breaking and retries are the router's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from infera.kv.hashing import block_hashes
from infera.kv.index import PrefixIndex
from infera.kv.load import LoadTracker
from infera.protocols.worker import WorkerRecord

# A cached block held only below the device must be copied back first: the share of its prefill it
# still saves, per medium (NVIDIA Dynamo weighs host-memory blocks 0.75), and for any other tier.
TIER_CREDIT = {"CPU": 0.75}
OTHER_TIER_CREDIT = 0.5


def cached_credit(index: PrefixIndex, worker_id: str, hashes: Sequence[int], overlap: int) -> float:
    """Blocks of prefill the ``overlap`` leading cached blocks save on ``worker_id``: a block on the device
    saves a whole block, one held only in a lower tier :data:`TIER_CREDIT` of one."""
    credit: float = overlap
    if overlap:
        for medium, count in index.lower_tier_blocks(worker_id, hashes, overlap).items():
            credit -= count * (1.0 - TIER_CREDIT.get(medium, OTHER_TIER_CREDIT))
    return credit


@dataclasses.dataclass(slots=True)
class RoutingContext:
    model: str
    # the prompt as the engine will tokenize it (a list, or the prompt cache's array: infera.kv.hashing.ArrayIds);
    # None if not tokenized
    token_ids: Sequence[int] | None
    prompt_tokens: int  # exact when token_ids is set, else an estimate
    max_tokens: int
    _hashes: dict[int, list[int]] = dataclasses.field(default_factory=dict)

    def hashes(self, block_size: int) -> list[int]:
        """The prompt's full-block router hashes for ``block_size`` (computed once per size)."""
        cached = self._hashes.get(block_size)
        if cached is None:
            cached = block_hashes(self.token_ids, block_size) if self.token_ids else []
            self._hashes[block_size] = cached
        return cached


@dataclasses.dataclass(slots=True)
class Candidate:
    worker: WorkerRecord
    in_flight: int  # requests the router has in flight on it
    prefill_tokens: int  # prompt tokens routed to it still waiting for their first token
    active_blocks: int  # distinct KV blocks its in-flight requests occupy


@dataclasses.dataclass(slots=True)
class Scores:
    costs: list[float]  # one per candidate, lower is better; any scale
    reason: str  # why, for the decision metric (e.g. "cache-hit", "rotation")
    overlap_blocks: list[int] | None = None  # per candidate, for kv-aware policies


class Policy(Protocol):
    """Scores candidates. A policy may also offer ``score_workers(ctx, workers, load) -> Scores | None``: the same
    scores from the worker records and the router's load tracker, without the :class:`Candidate` objects (kv-aware's
    one C call); None and the router scores candidates (:class:`infera.router.pick.Picker`)."""

    needs_tokens: bool  # the router tokenizes the prompt only for policies that need it

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores: ...


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyDeps:
    """What a policy may read. ``blind`` tells whether a worker's KV events are missing or stale;
    ``load`` is the router's own load accounting (read only: per worker the decode batch it routed
    and the TTFTs it observed, for a cost that calibrates itself); None outside a router. ``clock``
    is the router's clock, the one its predictions of cached blocks expire on."""

    index: PrefixIndex
    kv_overlap_weight: float
    blind: Callable[[str], bool]
    load: LoadTracker | None = None
    clock: Callable[[], float] = time.monotonic


class PolicyFactory(Protocol):
    """A policy class: ``needs_tokens`` is known before any instance exists."""

    needs_tokens: bool

    def __call__(self, deps: PolicyDeps) -> Policy: ...
