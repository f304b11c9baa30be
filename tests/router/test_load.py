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


def test_prefill_age_counts_from_the_request_that_found_the_queue_empty_or_the_latest_first_token() -> None:
    now = [10.0]
    load = LoadTracker(clock=lambda: now[0])
    assert load.prefill_age("w") == 0.0
    a = load.begin("w", 1000, [], 1)
    now[0] = 10.1
    b = load.begin("w", 500, [], 1)  # joins a queue being computed: the age stays the first's
    now[0] = 10.25
    assert abs(load.prefill_age("w") - 0.25) < 1e-9
    load.prefill_done(a)  # the work before this first token went to a prompt no longer queued
    now[0] = 10.3
    assert abs(load.prefill_age("w") - 0.05) < 1e-9
    load.prefill_done(b)
    assert load.prefill_age("w") == 0.0  # nothing queued


def test_ttft_seconds_are_the_samples_seconds_in_order_through_the_window() -> None:
    from infera.kv.load import TTFT_SAMPLES

    now = [0.0]
    load = LoadTracker(clock=lambda: now[0])
    assert list(load.ttft_seconds("w")) == [] and load.ttft_fastest("w") == 0.0
    for k in range(3 * TTFT_SAMPLES):
        ticket = load.begin("w", 10, [k], 1)
        now[0] += 0.001 * (k % 7 + 1) * (1 if k < TTFT_SAMPLES else 3)  # the fastest leaves the window, ties too
        load.prefill_done(ticket)
        load.prefill_done(ticket)  # once only
        load.end(ticket)
        count, samples = load.ttft_samples("w")
        assert list(load.ttft_seconds("w")) == [x.seconds for x in samples] and count == k + 1
        assert load.ttft_fastest("w") == min(x.seconds for x in samples)
    assert len(load.ttft_seconds("w")) == TTFT_SAMPLES
    load.forget("w")
    assert list(load.ttft_seconds("w")) == [] and load.ttft_fastest("w") == 0.0
