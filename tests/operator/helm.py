"""Real Helm from the tests: helm-sdkpy (Helm's Go library) needs Python 3.12, so its calls run in
.cache/helm-venv (scripts/setup makes it), one small script per action, JSON out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.operator.manifests import REPO

HELM_PYTHON = REPO / ".cache" / "helm-venv" / "bin" / "python"
CHART = REPO / "charts" / "infera"

LINT = "from helm_sdkpy import Configuration, Lint\nresult = asyncio.run(Lint(Configuration()).run(args[0]))"
# args: kubeconfig, namespace, release, chart, values (JSON), wait ("1"/"0")
INSTALL = ("from helm_sdkpy import Configuration, Install\n"
           "config = Configuration(namespace=args[1], kubeconfig=args[0])\n"
           "result = asyncio.run(Install(config).run(args[2], args[3], values=json.loads(args[4]), "
           "wait=args[5] == '1', timeout=150, create_namespace=True))")
# args: kubeconfig, namespace, release, wait
UNINSTALL = ("from helm_sdkpy import Configuration, Uninstall\n"
             "config = Configuration(namespace=args[1], kubeconfig=args[0])\n"
             "result = asyncio.run(Uninstall(config).run(args[2], wait=args[3] == '1', timeout=120))")


def helm(action: str, *args: str | Path, timeout: float = 180) -> Any:
    """Run one helm-sdkpy action (``LINT``, ``INSTALL``, ``UNINSTALL``); its result, JSON-decoded."""
    assert HELM_PYTHON.exists(), "no .cache/helm-venv: scripts/setup makes it (needs python3.12, pyenv has it)"
    script = f"import asyncio, json, sys\nargs = sys.argv[1:]\n{action}\nprint(json.dumps(result))"
    done = subprocess.run([str(HELM_PYTHON), "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
