"""The generated rules on victoria-metrics' MetricsQL, not only promtool's PromQL: a rule whose
operators the two engines could read apart, evaluated by a real victoria-metrics on the same
inputs as its promtool specification, gives the same values."""

from __future__ import annotations

import time

import pytest
from vm_support import import_series, victoria_metrics

from argus_core.rules.config import RulesConfig
from argus_core.rules.recording import recording_groups
from argus_core.rules.unit_tests.base import rank_labels
from argus_core.rules.unit_tests.statistics import host_excess_cases
from argus_core.score.prometheus import PrometheusAPI

RULE = "rank:argus_host_seconds:excess_increase"


@pytest.fixture(scope="module")
def victoria(tmp_path_factory):
    with victoria_metrics(tmp_path_factory.mktemp("vm")) as url:
        yield url


def test_the_host_excess_rule_reads_alike_on_metricsql(victoria):
    """The excess rule (``max without`` over two references told apart by ``label_replace``,
    ``group_left ()`` joins) on the promtool test's jobs of one, two and four ranks."""
    config = RulesConfig()
    expr = next(rule["expr"] for group in recording_groups(config) for rule in group["rules"]
                if rule.get("record") == RULE)
    now_ms = int(time.time() * 1000)
    expected = {}
    lines = []
    for job, rank, host_s, excess in host_excess_cases():
        labels = rank_labels(config, job, rank)
        lines.append({"metric": {"__name__": "rank:argus_host_seconds:increase", **labels},
                      "values": [host_s, host_s], "timestamps": [now_ms - 20_000, now_ms - 5_000]})
        expected[(job, str(rank))] = excess
    import_series(victoria, lines)
    api = PrometheusAPI(victoria, timeout_s=60)
    deadline = time.monotonic() + 120
    while len(api.query("rank:argus_host_seconds:increase")) < len(lines):
        assert time.monotonic() < deadline, "the imported series never became searchable"
        time.sleep(0.2)
    got = {(s["metric"]["job"], s["metric"]["rank"]): float(s["value"][1])
           for s in api.query(expr)}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
