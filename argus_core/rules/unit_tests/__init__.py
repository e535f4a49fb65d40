"""promtool unit tests for every alert and the recorded statistics, generated from the config.

Mixin style: each alert is tested with small synthetic series for "nothing yet" one evaluation
before its ``for`` runs out and "firing" right after, with exact labels and annotations; the
recorded group statistics are checked against the same arithmetic done here in Python. The
inputs are built from the config's thresholds and windows, so a user's own config regenerates
tests that still hold.

One module per generated file: ``l1``, ``l2``, ``pipeline`` (with L3), ``statistics``;
``base`` holds what they are built from.
"""

from __future__ import annotations

from argus_core.rules.config import RulesConfig, format_duration
from argus_core.rules.recording import recording_groups
from argus_core.rules.unit_tests.base import Series
from argus_core.rules.unit_tests.l1 import l1_tests
from argus_core.rules.unit_tests.l2 import l2_tests
from argus_core.rules.unit_tests.pipeline import l3_tests, pipeline_tests
from argus_core.rules.unit_tests.statistics import recording_tests

__all__ = ["Series", "unit_test_files"]

RULE_FILES = ["../../recording_rules/argus.rules.yml", "../argus.alerts.yml"]


RECORDING_RULE_FILES = ["../argus.rules.yml"]


def unit_test_files(config: RulesConfig) -> dict[str, dict]:
    """Relative path -> promtool test document."""
    from argus_core.rules.alerts import alert_groups

    groups = alert_groups(config)
    interval = format_duration(config.evaluation_interval)
    recording = [g["name"] for g in recording_groups(config)]
    # Recording groups first: alerts then read this evaluation's recorded series (Prometheus
    # runs groups independently, so live they may read the previous evaluation's).
    order = [*recording, *(g["name"] for g in groups)]

    def document(rule_files: list[str], tests: list[dict]) -> dict:
        return {"rule_files": rule_files, "evaluation_interval": interval,
                "group_eval_order": order if len(rule_files) > 1 else recording,
                "tests": tests}

    return {
        "alerting/tests/l1.test.yml": document(RULE_FILES, l1_tests(config, groups)),
        "alerting/tests/l2.test.yml": document(RULE_FILES, l2_tests(config, groups)),
        "alerting/tests/l3.test.yml": document(RULE_FILES, l3_tests(config, groups)),
        "alerting/tests/pipeline.test.yml": document(RULE_FILES,
                                                     pipeline_tests(config, groups)),
        "recording_rules/tests/statistics.test.yml": document(RECORDING_RULE_FILES,
                                                              recording_tests(config)),
    }
