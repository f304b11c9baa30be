"""The serving process's start-up hook: the heap built at start is frozen, young collections are rarer."""

from __future__ import annotations

import gc

from infera.server.__main__ import YOUNG_GC_ALLOCATIONS, freeze_heap


async def test_start_freezes_the_heap_and_raises_the_young_threshold_only() -> None:
    before = gc.get_threshold()
    try:
        gc.unfreeze()
        await freeze_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_GC_ALLOCATIONS, before[1], before[2])
        assert YOUNG_GC_ALLOCATIONS > 700  # CPython's default, which the measurement beat
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
