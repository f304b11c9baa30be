"""Which implementation of the prefix index's per-block loops runs: C (``infera.kv._native``, built from
csrc/index.c by ``pip install -e .``, see setup.py) or pure Python.

C when the extension was built, unless ``INFERA_PURE_PYTHON=1`` (tests and benchmarks use it, or pass
``native=False`` to :class:`infera.kv.index.PrefixIndex`). Both give the same hashes, index state and answers
(tests/kv/test_native.py); without a C compiler the install skips the extension and Python runs.
"""

from __future__ import annotations

import os
from types import ModuleType

ENV = "INFERA_PURE_PYTHON"


def load() -> ModuleType | None:
    """The compiled module, or None when it is not built or ``INFERA_PURE_PYTHON`` is set (to anything but 0)."""
    if os.environ.get(ENV, "0") not in ("", "0"):
        return None
    try:
        from infera.kv import _native
    except ImportError:
        return None
    return _native


def choose(native: bool | None) -> ModuleType | None:
    """A component's choice of implementation: True the C module (ImportError if it is not built), False none
    (Python), None :func:`load`'s default (C if built and ``INFERA_PURE_PYTHON`` is not set)."""
    if native is None:
        return load()
    if native:
        from infera.kv import _native

        return _native
    return None
