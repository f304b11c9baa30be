"""The two tiers of the suite (a pytest plugin, loaded by tests/conftest.py).

A test is ``e2e`` when it starts processes: when its module, or the module of any fixture it uses
(``fleet``, ``etcd``, ``kvd_fleet``, ...), holds one of the harness's process starters. Everything
else is the fast tier, and there starting a process fails the test with the fix in the message, so
the fast tier stays in-process. Set-up steps done once per machine are allowed: the Qwen tokenizer build,
and matplotlib's font cache, which its first import builds by running ``fc-list`` where fontconfig is installed.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import harness

SPAWNERS = (harness.spawn, harness.start_mock, harness.start_frontend, harness.EtcdServer, harness.NatsServer)
SETUP_STEPS = ("build_qwen_tokenizer.py", "fc-list")


def _holds_spawner(namespace: dict[str, Any], depth: int = 1) -> bool:
    """``namespace`` (a module's or a function's globals) holds a starter, or (``depth``) holds a
    function or class from a module that does, such as ``make_fleet`` or ``MockProcess``."""
    for value in list(namespace.values()):
        if any(value is s for s in SPAWNERS):
            return True
        home = sys.modules.get(getattr(value, "__module__", "") or "") if callable(value) else None
        if depth and home is not None and home.__dict__ is not namespace and _holds_spawner(vars(home), 0):
            return True
    return False


def spawns_processes(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    namespaces = [vars(item.module)] if getattr(item, "module", None) is not None else []
    namespaces += [d.func.__globals__ for defs in (info.name2fixturedefs.values() if info else ()) for d in defs]
    return any(_holds_spawner(ns) for ns in namespaces)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if spawns_processes(item):
            item.add_marker(pytest.mark.e2e)


@contextlib.contextmanager
def _no_processes(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("e2e"):
        yield
        return
    original = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
        if any(step in str(args) for step in SETUP_STEPS):
            return original(self, args, *rest, **kwargs)
        raise AssertionError(f"{item.nodeid} starts a process ({args!r:.80}): mark it @pytest.mark.e2e")

    subprocess.Popen._execute_child = refuse  # type: ignore[attr-defined]
    try:
        yield
    finally:
        subprocess.Popen._execute_child = original  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _no_processes(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _no_processes(item):
        yield
