"""The generated Prometheus rules: committed files equal the generator's output, promtool
accepts them and their unit tests pass, user overrides regenerate rules and tests that still
pass, bad overrides are refused with the key named, and Alertmanager's routing is what the
runbook says (amtool)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from promtools import promtool_test, run_tool

from argus_core.cli import main
from argus_core.rules.config import (
    RulesConfig,
    format_duration,
    load_config,
    override,
    parse_duration,
)
from argus_core.rules.generate import ALERTMANAGER_FILE, ALERTS_FILE, RULES_FILE, rendered

REPO = Path(__file__).resolve().parent.parent


def test_committed_files_are_what_the_generator_writes():
    for relative, text in rendered(RulesConfig()).items():
        path = REPO / relative
        assert path.exists(), f"{relative} is missing: run `make generate`"
        assert path.read_text() == text, f"{relative} differs: run `make generate`"


def test_promtool_accepts_every_rule_file():
    for relative in (RULES_FILE, ALERTS_FILE):
        result = run_tool("promtool", "check", "rules", str(REPO / relative))
        assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("path", sorted(
    p.relative_to(REPO) for p in REPO.glob("*/tests/*.test.yml")), ids=str)
def test_committed_promtool_tests_pass(path):
    result = promtool_test(REPO / path)
    assert result.returncode == 0, result.stdout


def test_every_alert_has_a_unit_test_and_a_runbook_section():
    alerts = yaml.safe_load((REPO / ALERTS_FILE).read_text())
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"]}
    tested = set()
    for path in REPO.glob("alerting/tests/*.test.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("alert_rule_test", ()):
                if check["exp_alerts"]:
                    tested.add(check["alertname"])
    assert names == tested
    runbook = (REPO / "docs/runbook.md").read_text()
    for name in names:
        assert f"## {name}\n" in runbook, f"docs/runbook.md has no section for {name}"
    for rule in (r for g in alerts["groups"] for r in g["rules"]):
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["labels"]["level"] in ("L1", "L2", "L3", "pipeline")
        assert rule["annotations"]["runbook_url"].endswith("#" + rule["alert"].lower())


def test_rules_are_named_level_metric_operations():
    rules = yaml.safe_load((REPO / RULES_FILE).read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        level, metric, operations = rule["record"].split(":")
        assert level and metric.startswith("argus_") and operations, rule["record"]


def test_a_users_overrides_regenerate_rules_and_tests_that_pass(tmp_path):
    config_file = tmp_path / "mine.yml"
    config_file.write_text(
        "selectors:\n  exporters: 'cluster=\"eu\"'\n  exporters_up: 'job=\"trainers\"'\n"
        "axes: [dp, tp]\nevaluation_interval: 30s\nspike_ratio: 2.0\nl2_min_ratio: 1.5\n"
        "for_straggler: 10m\nrunbook_url: https://wiki.example/argus\n")
    out = tmp_path / "out"
    assert main(["rules", "--config", str(config_file), "--out", str(out)]) == 0
    rules = (out / RULES_FILE).read_text()
    assert 'cluster="eu"' in rules and "argus.l2.pp" not in rules and "interval: 30s" in rules
    alerts = (out / ALERTS_FILE).read_text()
    assert ">= 2.0" in alerts and "for: 10m" in alerts and "https://wiki.example/argus#" in alerts
    for path in sorted(out.glob("*/tests/*.test.yml")):
        result = promtool_test(path)
        assert result.returncode == 0, f"{path.name}: {result.stdout}"


def test_promql_l2_mode_regenerates_rules_and_tests_that_pass(tmp_path):
    """``l2_source: promql``: the rules compute L2 themselves; their statistics match the
    arithmetic and the core's N and z, and with a disagreeing scorer beside them the
    dashboards' group statistics still read the rules' own series."""
    config_file = tmp_path / "mine.yml"
    config_file.write_text("l2_source: promql\n")
    out = tmp_path / "out"
    assert main(["rules", "--config", str(config_file), "--out", str(out)]) == 0
    assert "axis_group:argus_phase_seconds:median" in (out / RULES_FILE).read_text()
    for path in sorted(out.glob("*/tests/*.test.yml")):
        result = promtool_test(path)
        assert result.returncode == 0, f"{path.name}: {result.stdout}"


def test_scaled_rules_pass_their_tests(tmp_path):
    assert main(["rules", "--time-scale", "15", "--out", str(tmp_path)]) == 0
    assert "interval: 1s" in (tmp_path / RULES_FILE).read_text()
    for path in sorted(tmp_path.glob("*/tests/*.test.yml")):
        result = promtool_test(path)
        assert result.returncode == 0, f"{path.name}: {result.stdout}"


def test_the_defaults_file_reads_back_as_the_defaults():
    assert load_config(REPO / "argus.yml") == RulesConfig()


@pytest.mark.parametrize(("data", "message"), [
    ({"spike_ratoi": 2}, "unknown setting 'spike_ratoi'"),
    ({"rate_window": "2 minutes"}, "rate_window: '2 minutes' is not a duration"),
    ({"spike_ratio": "high"}, "spike_ratio: expected a number"),
    ({"l2_z": -1}, "l2_z: must be a finite number >= 0"),
    ({"warmup_steps": 2.5}, "warmup_steps: expected a whole number"),
    ({"axes": ["dp", "xp"]}, "axes: expected a list of dp, tp, ep"),
    ({"axes": ["dp", "pp"]}, "pp, pairs and collectives are judged by the scorer"),
    ({"silent_window": "4m"}, "silent_window: must be longer than Prometheus's 5m lookback"),
    ({"selectors": {"exporter": "a=\"b\""}}, "unknown selector 'exporter'"),
])
def test_bad_overrides_name_what_is_wrong(data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        override(RulesConfig(), data, "mine.yml")


def test_cli_reports_a_bad_config_without_writing(tmp_path, capsys):
    bad = tmp_path / "bad.yml"
    bad.write_text("for_regression: soon\n")
    assert main(["rules", "--config", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "for_regression: 'soon' is not a duration" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("text", "seconds"), [
    ("15s", 15), ("2m", 120), ("1h30m", 5400), ("600ms", 0.6), (90, 90)])
def test_durations_round_trip(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


# ------------------------------------------------------------------ Alertmanager (amtool)

def test_amtool_accepts_the_alertmanager_example():
    result = run_tool("amtool", "check-config", str(REPO / ALERTMANAGER_FILE))
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(("labels", "receiver"), [
    (["alertname=ArgusStragglerRank", "severity=critical", "level=L2", "job=llm"],
     "argus-page"),
    (["alertname=ArgusIterationRegression", "severity=critical", "level=L1", "job=llm"],
     "argus-page"),
    (["alertname=ArgusKernelStraggler", "severity=warning", "level=L3", "job=llm"],
     "argus-ticket"),
    (["alertname=ArgusProcessorDown", "severity=warning", "level=pipeline",
      "instance=node-3:9700"], "argus-pipeline"),
    (["alertname=Other", "job=llm"], "argus-default"),
    # argus act plans the drain; the ticket receiver still gets it (continue: true)
    (["alertname=ArgusSuspectUnit", "severity=warning", "level=L3", "job=llm",
      "unit_kind=leaf", "unit=leaf-1"], "argus-act,argus-ticket"),
])
def test_routes_by_level_and_severity(labels, receiver):
    result = run_tool("amtool", "config", "routes", "test",
                      f"--config.file={REPO / ALERTMANAGER_FILE}",
                      f"--verify.receivers={receiver}", *labels)
    assert result.returncode == 0, result.stdout
