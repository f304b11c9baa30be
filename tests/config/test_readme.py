"""The README tells the truth about configuration: every env name that is not ``INFERA_<FLAG>`` is named."""

from __future__ import annotations

import dataclasses
import re

import pytest

from harness import REPO
from infera.config.base import ENV_PREFIX, env_names
from infera.config.engine import MockEngineSettings
from infera.config.operator import OperatorSettings
from infera.config.server import ServerSettings
from infera.config.worker import WorkerSettings

README = (REPO / "README.md").read_text(encoding="utf-8")
SCHEMAS = (ServerSettings, WorkerSettings, MockEngineSettings, OperatorSettings)


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_every_env_name_off_the_infera_flag_rule_is_in_the_readme(schema: type) -> None:
    for f in dataclasses.fields(schema):
        names = env_names(f)
        if names == (ENV_PREFIX + f.name.upper(),):
            continue
        flag = "--" + f.name.replace("_", "-")
        assert flag in README, f"{flag} reads {names}: the README must say so"
        for name in names:
            assert re.search(rf"`{name}`", README), f"{flag} reads {name}: the README must say so"


def test_the_readme_does_not_call_landed_backends_missing() -> None:
    assert "until those backends land" not in README
