"""The C extension is really there where it can be: ./scripts/setup installs gcc and the Python headers, so
a missing ``infera.kv._native`` on such a machine is a broken build, not an optional feature quietly off
(the native half of the index tests would otherwise skip unnoticed)."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest

from infera.kv.native import ENV, load


def test_the_extension_is_built_where_a_compiler_and_headers_are(monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("gcc") is None or not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no C compiler or Python headers here: the index runs in pure Python by design")
    monkeypatch.delenv(ENV, raising=False)
    assert load() is not None, "gcc and Python.h are here but infera.kv._native is not built: run ./scripts/setup"
