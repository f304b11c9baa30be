"""Both implementations of the index's per-block loops and the prompt cache's id arrays: tests that use
``index_path`` run once in pure Python and once with the C extension (skipped when it is not built), whatever
``INFERA_PURE_PYTHON`` says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infera.kv import hashing, prompt_cache
from infera.kv.native import ENV, load


@pytest.fixture(scope="module", params=["pure", "native"])
def index_path(request: pytest.FixtureRequest) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "native":
            mp.delenv(ENV, raising=False)
            native = load()
            if native is None:
                pytest.skip("the C extension infera.kv._native is not built")
        else:
            mp.setenv(ENV, "1")
            native = None
        mp.setattr(hashing, "_native", native)
        mp.setattr(prompt_cache, "_native", native)
        yield str(request.param)
