"""``argus generate``: one config writes the rules, alerts, routing, promtool tests and the
dashboards, and they agree. With the defaults it writes exactly the committed files; with a
changed selector, axis set, threshold, scrape job, ``for`` and ``l2_source`` every output
changes with it, and the generated promtool tests pass on the generated rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from promtools import promtool_test, run_tool

from argus_core.cli import main
from argus_grafana import queries

REPO = Path(__file__).resolve().parent.parent
CHANGED = """
selectors:
  exporters: 'cluster="eu"'
  processor: 'cluster="eu"'
  exporters_up: 'job="train-exporters"'
l2_source: promql
axes: [dp]
spike_ratio: 1.7
for_straggler: 10m
"""


def generate(tmp_path: Path, config: str | None = None) -> tuple[Path, list[str]]:
    """Run ``argus generate`` into a fresh directory: (that directory, the paths it printed)."""
    out = tmp_path / "out"
    args = ["generate", "--out", str(out)]
    if config is not None:
        path = tmp_path / "mine.yml"
        path.write_text(config)
        args += ["--config", str(path)]
    assert main(args) == 0
    return out, sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def test_defaults_write_exactly_the_committed_files(tmp_path):
    out, files = generate(tmp_path)
    assert {"argus.yml", "recording_rules/argus.rules.yml", "alerting/argus.alerts.yml",
            "alerting/alertmanager.yml", "grafana/dashboards/argus-overview.json",
            "grafana/provisioning/dashboards/argus.yaml"} <= set(files)
    for relative in files:
        assert (out / relative).read_text() == (REPO / relative).read_text(), (
            f"{relative} differs from the committed copy: run `make generate`")


@pytest.fixture(scope="module")
def changed(tmp_path_factory) -> Path:
    out, _ = generate(tmp_path_factory.mktemp("changed"), CHANGED)
    return out


def _exprs(document) -> list[str]:
    """Every ``expr`` string anywhere in a JSON/YAML document."""
    if isinstance(document, dict):
        return [v for k, v in document.items() if k == "expr" and isinstance(v, str)] + [
            e for v in document.values() for e in _exprs(v)]
    if isinstance(document, list):
        return [e for v in document for e in _exprs(v)]
    return []


def _selectors_of(expr: str, source: str) -> list[str]:
    """The label matchers (``{...}``, empty when none) on each series of ``source`` (exporter,
    processor) that ``expr`` reads."""
    names = {n for n, s in queries.METRICS.items() if s == source}
    found = []
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"|(?<![\w:])([a-zA-Z_:][\w:]*)(\{[^{}]*\})?',
                             expr):
        if match.group(1) in names:
            found.append(match.group(2) or "")
    return found


def test_the_rules_take_every_changed_setting(changed):
    rules = yaml.safe_load((changed / "recording_rules/argus.rules.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    exporter = [s for e in exprs for s in _selectors_of(e, queries.EXPORTER)]
    assert exporter and all('cluster="eu"' in s for s in exporter), exporter
    records = {(r["record"], r.get("labels", {}).get("axis"))
               for g in rules["groups"] for r in g["rules"] if "record" in r}
    assert ("axis_group:argus_phase_seconds:median", "dp") in records  # l2_source: promql
    assert ("axis_group:argus_phase_seconds:median", "tp") not in records  # axes: [dp]
    alerts = {r["alert"]: r for g in yaml.safe_load(
        (changed / "alerting/argus.alerts.yml").read_text())["groups"] for r in g["rules"]}
    assert ">= 1.7" in alerts["ArgusIterationSpike"]["expr"]
    assert alerts["ArgusStragglerRank"]["for"] == "10m"
    assert 'job="train-exporters"' in alerts["ArgusExporterDown"]["expr"]


def test_the_dashboards_take_the_same_settings(changed):
    boards = {p.stem: json.loads(p.read_text())
              for p in (changed / "grafana/dashboards").glob("*.json")}
    assert len(boards) == 5
    exprs = [e for board in boards.values() for e in _exprs(board)]
    for source in (queries.EXPORTER, queries.PROCESSOR):
        matchers = [s for e in exprs for s in _selectors_of(e, source)]
        assert matchers and all('cluster="eu"' in s for s in matchers), (source, matchers)
    spike = next(a for a in boards["argus-overview"]["annotations"]["list"]
                 if a["name"].startswith("Spikes"))
    assert spike["expr"].endswith(">= 1.7") and ">= 1.7x" in spike["name"]
    axis = next(v for v in boards["argus-stragglers"]["templating"]["list"]
                if v["name"] == "axis")
    assert [o["value"] for o in axis["options"]] == ["dp"]
    assert any('up{job="train-exporters"}' in e for e in _exprs(boards["argus-pipeline"]))
    # the default scrape job is read nowhere
    assert not any('up{job="argus-exporters"}' in e for e in exprs)


def test_the_generated_promtool_tests_pass_on_the_generated_rules(changed):
    tests = sorted(changed.glob("*/tests/*.test.yml"))
    assert len(tests) >= 5
    for path in tests:
        result = promtool_test(path)
        assert result.returncode == 0, f"{path.name}:\n{result.stdout[-3000:]}"


def test_a_bad_config_is_refused_naming_the_key(tmp_path, capsys):
    path = tmp_path / "bad.yml"
    path.write_text("spike_ratoi: 2\n")
    assert main(["generate", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "spike_ratoi" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["defaults", "changed"])
def test_vmalert_loads_the_generated_rules(source, changed):
    """vmalert (the VictoriaMetrics engine's ruler) parses every generated expression as
    MetricsQL and every annotation template, as Prometheus does."""
    root = REPO if source == "defaults" else changed
    files = [root / "recording_rules/argus.rules.yml", root / "alerting/argus.alerts.yml"]
    result = run_tool("vmalert", "-dryRun", "-loggerLevel=ERROR",
                      *(f"-rule={path}" for path in files))
    assert result.returncode == 0, result.stdout[-3000:]
