"""Each extra is importable with only its own dependencies: a fresh interpreter in which
every optional package outside the extra (and what it pulls in) fails to import, as it would
in an image that installed ``argus-failslow[EXTRA]`` alone, imports that extra's entry points.
The extras' lists are read from pyproject.toml, so a dependency added to one module and not
to its extra fails here."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# distribution name in pyproject.toml -> the top-level modules it installs
MODULES = {
    "prometheus-client": ["prometheus_client"], "scipy": ["scipy"], "rich": ["rich"],
    "matplotlib": ["matplotlib"], "aiohttp": ["aiohttp"], "boto3": ["boto3", "botocore"],
    "perfetto": ["perfetto"], "isal": ["isal"], "pyyaml": ["yaml"],
    "backports.zstd": ["backports"], "grafana-foundation-sdk": ["grafana_foundation_sdk"],
    "py-spy": [], "cupti-python": ["cupti"], "nvidia-cuda-cupti": [],
}
OPTIONAL = {m for ms in MODULES.values() for m in ms} | {"torch", "opentelemetry", "moto"}
# What each extra is for: the modules a user of only that extra imports.
ENTRY_POINTS = {
    "exporters": ["argus_exporters", "argus_exporters.hooks", "argus_exporters.metrics",
                  "argus_exporters.sinks.http", "argus_core.cli", "argus_core.schema"],
    "analysis": ["argus_core.detect.diagnose", "argus_core.simulate", "argus_core.report.text",
                 "argus_core.cli.diagnose", "argus_core.cli.demo"],
    "service": ["argus_core.processor.service", "argus_core.processor.links",
                "argus_core.score.service", "argus_core.rules.generate",
                "argus_core.stack.stack"],
    "dashboards": ["argus_grafana.generate", "argus_grafana.queries", "argus_grafana.check",
                   "argus_core.cli.dashboards", "argus_core.cli.generate"],
}
BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not in this extra)", name=name)
        return None
sys.meta_path.insert(0, Blocked())
import importlib
for module in sys.argv[2].split(","):
    importlib.import_module(module)
"""


def allowed(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """The optional top-level modules ``extra`` installs, with the extras it includes."""
    out: set[str] = set()
    for requirement in extras[extra]:
        name = re.split(r"[\[<>=!;~ ]", requirement, maxsplit=1)[0]
        if name == "argus-failslow":
            for inner in re.findall(r"\[(.*?)\]", requirement)[0].split(","):
                out |= allowed(inner.strip(), extras)
        else:
            assert name in MODULES, f"{name}: add the modules it installs to MODULES"
            out |= set(MODULES[name])
    return out


@pytest.mark.parametrize("extra", list(ENTRY_POINTS))
def test_an_extra_imports_with_only_its_own_dependencies(extra):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    blocked = OPTIONAL - allowed(extra, extras)
    result = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(sorted(blocked)),
                             ",".join(ENTRY_POINTS[extra])], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, (f"[{extra}] without {sorted(blocked)}:\n"
                                    f"{result.stderr[-3000:]}")


def test_the_blocker_blocks():
    """The check itself can fail: the exporters' entry points cannot import the analysis
    extra's modules once scipy is blocked."""
    result = subprocess.run([sys.executable, "-c", BLOCKER, "scipy",
                             "argus_core.detect.diagnose"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "not in this extra" in result.stderr
