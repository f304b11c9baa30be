"""One request as the engine core sees it: tokens, progress through them, and its KV blocks."""

from __future__ import annotations

import dataclasses
from typing import Any

from infera.engine.mock.cache import Block


@dataclasses.dataclass(eq=False, slots=True)
class Sequence:
    """A request inside the scheduler.

    ``tokens`` holds the prompt followed by every output token sampled so far;
    ``output_ids`` is the whole planned output (the mock decides it at admission), of which
    ``num_emitted`` have been sampled. ``num_computed`` counts tokens whose KV is in
    ``blocks``; ``digests`` are the chained block digests of the full blocks of ``tokens``.
    """

    request_id: str
    tokens: list[int]
    output_ids: list[int]
    prompt_len: int = 0
    num_computed: int = 0
    num_emitted: int = 0
    blocks: list[Block] = dataclasses.field(default_factory=list)
    digests: list[bytes] = dataclasses.field(default_factory=list)
    num_cached_blocks: int = 0  # blocks[:num_cached_blocks] are registered in the pool's hash map
    cached_tokens: int = -1  # prefix-cache hit at first schedule, in tokens; -1 = not scheduled yet
    transferred: int = 0  # leading prompt tokens whose KV came from a prefill worker (no compute)
    preemptions: int = 0
    finished: bool = False
    arrival: float = 0.0
    first_token_at: float = 0.0
    owner: Any = None  # the API layer's handle, notified by the engine

    def __post_init__(self) -> None:
        if not self.prompt_len:
            self.prompt_len = len(self.tokens)

    @property
    def done_sampling(self) -> bool:
        return self.num_emitted >= len(self.output_ids)
