"""Both implementations of the index's per-block loops: tests that use ``index_path`` run once in pure Python
and once with the C extension (skipped when it is not built), whatever ``INFERA_PURE_PYTHON`` says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infera.kv import hashing
from infera.kv.native import ENV, load


@pytest.fixture(scope="module", params=["pure", "native"])
def index_path(request: pytest.FixtureRequest) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "native":
            mp.delenv(ENV, raising=False)
            native = load()
            if native is None:
                pytest.skip("the C extension infera.kv._native is not built")
            mp.setattr(hashing, "_native", native)
        else:
            mp.setenv(ENV, "1")
            mp.setattr(hashing, "_native", None)
        yield str(request.param)
