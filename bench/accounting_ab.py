"""A whole answer's accounting after the write, in process: 7542d7d's steps (rebuilt here) vs this tree's.

``old`` is what ``Accounting.__call__`` did at 7542d7d: ``StreamTally.of(body).usage()``, an ``Outcome``, and
``OpenAIHandlers.complete`` with one ``ServerMetrics.of`` per observation. ``new`` is this tree's: ``usage_of``
and the endpoint's ``EndpointAccounts.record``. Same registry kind, same observations (a time to first byte, a
status, a duration, two token counts). Interleaved rounds; µs per answer, the best of 3 repeats per round,
median over rounds.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/accounting_ab.py --rounds 7 --n 50000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
from collections.abc import Callable, Iterator
from typing import Any

import infera.server.metrics as server_metrics
from infera.server.metrics import ServerMetrics
from infera.server.relay import Outcome
from infera.server.tally import StreamTally, usage_of

PATH = "/v1/chat/completions"
BODY = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "one two three four"},
                                "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 1000, "completion_tokens": 8, "total_tokens": 1008}}).encode()


def _no_router(self: Any) -> Iterator[Any]:
    return iter(())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=50000)
    args = ap.parse_args()
    server_metrics._RouterCollector.collect = _no_router  # type: ignore[method-assign]  # request metrics only
    m = ServerMetrics(None)  # type: ignore[arg-type]  # the router is only read at scrape time
    started = time.perf_counter()

    def old() -> None:
        usage = StreamTally.of(bytes(BODY)).usage()
        outcome = Outcome(PATH, str(200), started, usage, 0.004)
        path = outcome.path
        if outcome.ttft is not None:
            m.of(m.ttft, path).observe(outcome.ttft)
        m.of(m.requests, path, outcome.status).inc()
        m.of(m.e2e, path).observe(time.perf_counter() - outcome.started)
        u = outcome.usage
        if u is not None:
            m.of(m.tokens, path, "prompt").inc(u.prompt_tokens)
            m.of(m.tokens, path, "completion").inc(u.completion_tokens)
            if u.cached_tokens:
                m.of(m.tokens, path, "cached").inc(u.cached_tokens)

    def new() -> None:
        accounts = m.accounts(PATH)  # made when the answer is made
        accounts.record(str(200), started, 0.004, usage_of(bytes(BODY)))

    runs: dict[str, list[float]] = {"old": [], "new": []}
    ways: list[tuple[str, Callable[[], None]]] = [("old", old), ("new", new)]
    for r in range(args.rounds):
        for name, f in ways if r % 2 == 0 else ways[::-1]:
            runs[name].append(min(timeit.repeat(f, number=args.n, repeat=3)) / args.n * 1e6)
    before, after = statistics.median(runs["old"]), statistics.median(runs["new"])
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.rounds} rounds x {args.n}: "
          f"7542d7d's steps {before:.2f} µs, this tree {after:.2f} µs, {after / before:.3f}x")


if __name__ == "__main__":
    main()
