"""Running the real promtool and amtool from the tests (Debian's prometheus packages)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def binary(name: str) -> str:
    """Path of a Prometheus, Alertmanager or VictoriaMetrics binary, or skip
    (``scripts/system-deps.sh``, which ``make test`` runs, installs them)."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install prometheus "
                    f"prometheus-alertmanager victoria-metrics)")
    return path


def run_tool(name: str, *args: str, cwd: Path | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run promtool/amtool; the result holds its combined output in ``stdout``."""
    return subprocess.run([binary(name), *args], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def promtool_test(path: Path) -> subprocess.CompletedProcess:
    """``promtool test rules`` on one test file, run from its directory (relative paths)."""
    return run_tool("promtool", "test", "rules", path.name, cwd=path.parent)
