"""Imports only run down the layers: every ``import`` in the installed packages (at module
level or inside a function, where a cycle would otherwise hide) names a module of the same
unit or of a lower layer. The layers are the architecture (docs/architecture.md): the
exporters and the record schema at the bottom, the statistics, the core's detection, then
the services and tools built on it, the command line on top."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"argus_core": ROOT / "argus_core", "argus_exporters": ROOT / "exporters",
            "argus_grafana": ROOT / "grafana"}
# unit -> layer; a unit imports its own modules and units of lower layers only
LAYERS = {
    "argus_exporters": 0, "argus_core": 0, "core.schema": 0, "core.timeparse": 0,
    "core.gcpause": 0,
    "core.trace": 1, "core.taxonomy": 1, "core.stats": 1,
    "core.topology": 2, "core.hardware": 2, "core.summaries": 2, "core.reader": 2,
    "core.detect": 3,
    "core.report": 4, "core.processor": 4,
    "core.simulate": 5,
    "core.score": 6,
    "core.rules": 7, "core.act": 7,
    "core.stack": 8,
    "argus_grafana": 9,
    "core.cli": 10,
}


def unit(module: str) -> str:
    """The layer unit of a module: a subpackage or module of argus_core, or a package."""
    parts = module.split(".")
    return f"core.{parts[1]}" if parts[0] == "argus_core" and len(parts) > 1 else parts[0]


def imports() -> list[tuple[str, str, str]]:
    """(importing module's unit, imported module, file:line) for every import of ours."""
    found = []
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "tests" in parts:
                continue
            module = ".".join([package, *parts]).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.module
                         and node.level == 0 else [])
                found += [(unit(module), name, f"{path.relative_to(ROOT)}:{node.lineno}")
                          for name in names if name.split(".")[0] in PACKAGES]
    return found


def test_every_unit_has_a_layer():
    units = {u for u, _, _ in imports()} | {unit(name) for _, name, _ in imports()}
    assert units <= set(LAYERS), f"give these a layer: {sorted(units - set(LAYERS))}"


def test_imports_only_run_down_the_layers():
    upward = [f"{where}: {source} (layer {LAYERS[source]}) imports {name} "
              f"(layer {LAYERS[unit(name)]})"
              for source, name, where in imports()
              if unit(name) != source and LAYERS[unit(name)] >= LAYERS[source]]
    assert not upward, "\n".join(upward)


def test_the_check_sees_imports_inside_functions():
    """The scan reads function-local imports too (the cycles they hide are cycles)."""
    local = [where for _, name, where in imports()
             if name == "argus_core.detect.diagnose" and where.startswith("argus_core/cli")]
    assert local, "argus_core.cli imports the diagnosis inside its functions"
