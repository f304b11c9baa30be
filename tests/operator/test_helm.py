"""Real Helm (helm-sdkpy: Helm's Go library) lints charts/infera: templates render with Helm's own
engine and the values schema holds. helm-sdkpy needs Python 3.12, so it runs in .cache/helm-venv
(scripts/setup makes it)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.operator.helm import CHART, LINT, helm

pytestmark = pytest.mark.e2e

ERROR = 3  # Helm's support.ErrorSev (1 info, 2 warning)


def lint(chart: Path) -> dict[str, Any]:
    result: dict[str, Any] = helm(LINT, chart)
    return result


def test_helm_lints_the_chart_clean() -> None:
    result = lint(CHART)
    assert result["TotalChartsLinted"] == 1
    assert not [m for m in result["Messages"] if m["Severity"] >= ERROR], result


def test_helm_lint_catches_a_broken_template(tmp_path: Path) -> None:
    broken = tmp_path / "infera"
    shutil.copytree(CHART, broken)
    with (broken / "templates" / "operator.yaml").open("a") as f:
        f.write("\n{{ .Values.nothing.here }}\n")
    result = lint(broken)
    assert [m for m in result["Messages"] if m["Severity"] >= ERROR], "a nil pointer in a template is an error"
