"""Least load: the decode leg of a disaggregated pair, where the prompt's KV arrives by transfer.

cost(w) = distinct KV blocks w's in-flight requests hold (prompt and expected output), the
decode-side load; cache locality does not matter because the decode worker receives the
prompt's KV from the prefill worker either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from infera.router.base import Candidate, PolicyDeps, RoutingContext, Scores


class LeastLoadPolicy:
    needs_tokens = False

    def __init__(self, deps: PolicyDeps) -> None:
        pass

    def score(self, ctx: RoutingContext, candidates: Sequence[Candidate]) -> Scores:
        return Scores(costs=[float(c.active_blocks) for c in candidates], reason="load")
