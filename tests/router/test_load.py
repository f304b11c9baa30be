from __future__ import annotations

from infera.kv.load import LoadTracker


def test_shared_prefix_blocks_count_once_and_release_fully() -> None:
    load = LoadTracker()
    a = load.begin("w", prefill_tokens=64, hashes=[1, 2, 3, 4], tail_blocks=2)
    b = load.begin("w", prefill_tokens=16, hashes=[1, 2, 3, 5], tail_blocks=2)
    assert load.in_flight("w") == 2
    assert load.active_blocks("w") == 5 + 4  # distinct prompt blocks + both tails
    assert load.prefill_tokens("w") == 80
    load.prefill_done(a)
    assert load.prefill_tokens("w") == 16
    load.end(a)
    load.end(a)  # idempotent
    load.end(b)
    assert (load.in_flight("w"), load.active_blocks("w"), load.prefill_tokens("w")) == (0, 0, 0)


def test_forgotten_worker_does_not_corrupt_its_successor() -> None:
    load = LoadTracker()
    old = load.begin("w", 10, [1], 1)
    load.forget("w")
    new = load.begin("w", 10, [1], 1)
    load.end(old)
    assert load.in_flight("w") == 1 and load.active_blocks("w") == 2
    load.end(new)
    assert load.in_flight("w") == 0
