"""Real Helm (helm-sdkpy: Helm's Go library) lints charts/infera: templates render with Helm's own
engine and the values schema holds. helm-sdkpy needs Python 3.12, so it runs in .cache/helm-venv
(scripts/setup makes it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.operator.manifests import REPO

pytestmark = pytest.mark.e2e

HELM_PYTHON = REPO / ".cache" / "helm-venv" / "bin" / "python"
LINT = ("import asyncio, json, sys\nfrom helm_sdkpy import Configuration, Lint\n"
        "print(json.dumps(asyncio.run(Lint(Configuration()).run(sys.argv[1]))))")
ERROR = 3  # Helm's support.ErrorSev (1 info, 2 warning)


def lint(chart: Path) -> dict[str, Any]:
    assert HELM_PYTHON.exists(), "no .cache/helm-venv: scripts/setup makes it (needs python3.12, pyenv has it)"
    done = subprocess.run([str(HELM_PYTHON), "-c", LINT, str(chart)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_helm_lints_the_chart_clean() -> None:
    result = lint(REPO / "charts" / "infera")
    assert result["TotalChartsLinted"] == 1
    assert not [m for m in result["Messages"] if m["Severity"] >= ERROR], result


def test_helm_lint_catches_a_broken_template(tmp_path: Path) -> None:
    broken = tmp_path / "infera"
    shutil.copytree(REPO / "charts" / "infera", broken)
    with (broken / "templates" / "operator.yaml").open("a") as f:
        f.write("\n{{ .Values.nothing.here }}\n")
    result = lint(broken)
    assert [m for m in result["Messages"] if m["Severity"] >= ERROR], "a nil pointer in a template is an error"
