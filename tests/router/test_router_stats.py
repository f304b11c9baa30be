"""The overlap histogram of the routing decisions: counted by bisection, read back cumulative."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from infera.router.pick import OVERLAP_BUCKETS, RouterStats

fractions = st.one_of(st.sampled_from(OVERLAP_BUCKETS), st.floats(min_value=0.0, max_value=1.5),
                      st.fractions(min_value=0, max_value=1).map(float))


@given(st.lists(fractions, max_size=60))
def test_buckets_equal_a_count_per_bound(observed: list[float]) -> None:
    """Each cumulative bucket counts the observations at or below its bound, as Prometheus' histogram
    ``le`` buckets do; a bound itself falls in its own bucket."""
    stats = RouterStats()
    for f in observed:
        stats.observe_overlap(f)
    assert stats.overlap_buckets == [sum(1 for f in observed if f <= b) for b in OVERLAP_BUCKETS]
    assert stats.overlap_count == len(observed)
    assert stats.overlap_sum == sum(observed)
