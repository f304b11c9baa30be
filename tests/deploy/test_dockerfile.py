"""The image's build stage copies everything its wheel needs to carry infera's C extensions.

No Docker here, so the build stage is replayed: its ``COPY`` lines are applied to a temporary
directory and ``pip wheel`` runs its ``RUN`` step there. A stage that forgot ``setup.py`` or
``csrc/`` still builds a wheel, silently without the extensions (they are optional), and the image
then runs every pure-Python fallback; this test fails on that.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
EXTENSIONS = ("infera/kv/_native", "infera/kv/_bpe", "infera/telemetry/_otlp")


def stages(text: str) -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), one list per ``FROM`` stage."""
    out: list[list[str]] = []
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        out[-1].append(line)
    return out


def replay_copies(stage: list[str], dest: Path) -> None:
    """Apply a stage's ``COPY src... dst`` lines (from the build context, the repo root) under ``dest``."""
    for line in stage:
        words = line.split()
        if words[0].upper() != "COPY" or any(w.startswith("--from") for w in words):
            continue
        *sources, target = words[1:]
        for source in sources:
            origin = REPO / source
            where = dest / target
            if origin.is_dir():
                shutil.copytree(origin, where, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
            else:
                where = where / origin.name if target.endswith("/") else where
                where.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, where)


@pytest.mark.e2e
def test_the_build_stage_makes_a_wheel_with_every_c_extension(tmp_path: Path) -> None:
    build, runtime = stages(DOCKERFILE.read_text())
    assert any("gcc" in line for line in build if line.upper().startswith("RUN")), "the build stage needs a compiler"
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    replay_copies(build, src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), str(src)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("infera-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    missing = [ext for ext in EXTENSIONS if not any(n.startswith(ext) and n.endswith(".so") for n in names)]
    assert not missing, f"the image's wheel lacks {missing}: the build stage does not copy what setup.py compiles"
    assert any("--from=build" in line and "/wheels" in line for line in runtime), "the runtime stage takes the wheel"
    assert any(line.upper().startswith("RUN") and "/wheels/" in line for line in runtime)
