"""``infera.kv._native.U64Map`` (the C index's tables) against a dict: the same contents, lookups and iteration
order after every step of random insertions, overwrites, deletions, pops, updates and clears, at sizes that make
it grow and probe runs that deletions shift back."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infera.kv.native import load

native = load()
pytestmark = pytest.mark.skipif(native is None, reason="the C extension infera.kv._native is not built")

# Few distinct keys so that deletions hit; some huge (probe collisions are by the high bits of key * constant).
keys = st.one_of(st.integers(0, 40), st.sampled_from([2**63, 2**64 - 1, 2**32, 2**30, 2**60 + 5]),
                 st.integers(0, 2**64 - 1))
op = st.one_of(
    st.tuples(st.just("set"), keys, st.integers(0, 2**64 - 1)),
    st.tuples(st.just("del"), keys),
    st.tuples(st.just("pop"), keys),
    st.tuples(st.just("update"), st.lists(st.tuples(keys, st.integers(0, 2**64 - 1)), max_size=8)),
    st.tuples(st.just("many"), st.integers(0, 2**62), st.integers(1, 300)),
    st.tuples(st.just("clear")),
)


def _check(m: Any, d: dict[int, Any]) -> None:
    assert len(m) == len(d)
    assert m.items() == list(d.items())  # insertion order, as a dict keeps it
    assert list(m) == list(d) == m.keys() and m.values() == list(d.values())
    assert m == d and m.as_dict() == d
    assert m.head(3) == list(d)[:3]
    for k in list(d)[:20]:
        assert k in m and m[k] == d[k] and m.get(k) == d[k]


@pytest.mark.parametrize("objects", [False, True])
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=60))
def test_u64map_is_a_dict(objects: bool, ops: list[tuple[Any, ...]]) -> None:
    m, d = native.U64Map(objects), {}
    for o in ops:
        if o[0] == "set":
            v = o[2] if not objects else (o[2], "x")
            m[o[1]] = v
            d[o[1]] = v
        elif o[0] == "del":
            if o[1] in d:
                del m[o[1]]
                del d[o[1]]
            else:
                with pytest.raises(KeyError):
                    del m[o[1]]
        elif o[0] == "pop":
            assert m.pop(o[1], None) == d.pop(o[1], None)
        elif o[0] == "update":
            pairs = [(k, v if not objects else [v]) for k, v in o[1]]
            m.update(pairs)
            d.update(pairs)
        elif o[0] == "many":  # grow past a few resizes, then delete every other one: shifted probe runs
            start, n = o[1], o[2]
            for k in range(start, start + n * 7919, 7919):
                m[k] = k if not objects else str(k)
                d[k] = k if not objects else str(k)
            for k in range(start, start + n * 7919, 2 * 7919):
                assert m.pop(k) == d.pop(k)
        else:
            m.clear()
            d.clear()
        _check(m, d)
        absent = 2**64 - 2
        if absent not in d:
            assert absent not in m and m.get(absent, 7) == 7 and m.pop(absent, 8) == 8


def test_u64map_keys_and_values_outside_u64() -> None:
    m = native.U64Map(False)
    for bad in (-1, 2**64, "a", 1.5, None):
        assert bad not in m and m.get(bad) is None and m.pop(bad, 3) == 3
        with pytest.raises((OverflowError, TypeError)):
            m[bad] = 1
        with pytest.raises(KeyError):
            m[bad]
    with pytest.raises(OverflowError):
        m[1] = -1
    assert len(m) == 0 and m == {}
    m[True] = 5  # an int like 1, as in a dict
    assert m[1] == 5 and m == {1: 5}
    o = native.U64Map(True)
    o[3] = "x"
    assert o.pop(3) == "x" and o == {} and (o != {3: 1})


def test_u64map_holds_its_objects() -> None:
    o = native.U64Map(True)
    value = object()
    o[1] = value
    o[2] = [o]  # a cycle through the table: the collector frees it
    del value
    assert isinstance(o[1], object)
    del o
    gc.collect()
