"""promtool tests of the L2 alerts: ArgusStragglerRank from its source (the scorer's findings
or the rules' own comparison), the scorer's pair member and ArgusLinkDegraded."""

from __future__ import annotations

import math

from argus_core.rules.config import L2_PROMQL, RulesConfig
from argus_core.rules.unit_tests.base import (
    Series,
    alert_labels,
    annotations,
    check,
    expect,
    fires,
    humanize_duration,
    intervals,
    matchers,
    rank_labels,
    rule_named,
    unit_test,
)


def normal_upper_quantile(p: float) -> float:
    """Phi^-1(1 - p) as the rules compute it (``recording.normal_upper_quantile``)."""
    from argus_core.rules.recording import _ACKLAM_C, _ACKLAM_D

    q = math.sqrt(-2 * math.log(p))

    def horner(coefficients: tuple[float, ...]) -> float:
        value = coefficients[0]
        for c in coefficients[1:]:
            value = value * q + c
        return value

    return -horner(_ACKLAM_C) / horner(_ACKLAM_D)


def l2_margin(config: RulesConfig, tests: int, sigma: float | None = None) -> float:
    """ln of the ratio above a group's median at which the rules flag a rank, for a job
    judging ``tests`` statistics (``sigma``: the pooled spread, the floor when None)."""
    z = max(config.l2_z, normal_upper_quantile(config.l2_alpha / tests))
    return max(math.log(config.l2_min_ratio), z * max(sigma or 0.0, config.l2_scale_floor))


def host_l2_margin(config: RulesConfig, tests: int) -> float:
    """The same for a job whose exporters time phases on the host clock."""
    return l2_margin(config, tests, config.l2_host_scale_floor)


def scorer_labels(config: RulesConfig, job: str, rank: int, phase: str, axis: str,
                   **coords: int) -> dict[str, str]:
    """The labels of one ``argus_phase_straggler_ratio`` series."""
    ident = rank_labels(config, job, rank, **coords)
    ident = {k: v for k, v in ident.items() if k not in matchers(config.selectors.exporters)}
    return {**matchers(config.selectors.scorer), **ident, "phase": phase, "axis": axis}


def l2_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """ArgusStragglerRank from its source (``l2_source``: the scorer's findings, or the
    rules' own comparison), the scorer's pair member, and a collective slow with nobody
    arriving late (ArgusLinkDegraded)."""
    tests = (l2_promql_tests(config, groups) if config.l2_source == L2_PROMQL
             else l2_scorer_tests(config, groups))
    return tests + l2_scorer_finding_tests(config, groups)


def l2_scorer_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """``l2_source: scorer``: the scorer's compute finding fires with its labels after
    ``for`` (its collective finding does not: that is ArgusLinkDegraded's); a healthy job's
    phases, however uneven, raise nothing without a finding; and a scorer that goes stale
    raises ArgusScorerStale and no L2 alert (nothing stale is judged)."""
    rule = rule_named(groups, "ArgusStragglerRank")
    samples = intervals(config, config.for_straggler) + 2
    straggler = scorer_labels(config, "train", 3, "mlp", "dp", dp=3)
    waiter = scorer_labels(config, "train", 0, "dp-allreduce", "dp", dp=0)
    series = [Series("argus_phase_straggler_ratio", {**straggler, "kind": "compute"},
                     [1.5] * samples),
              Series("argus_phase_straggler_ratio", {**waiter, "kind": "communication"},
                     [2.0] * samples)]
    expected = expect(alert_labels(config, rule, **straggler), annotations(rule, **{
        "$labels.rank": "3", "$labels.host": "node-0", "$labels.job": "train",
        "$labels.axis": "dp", "$labels.phase": "mlp", '$value | printf "%.2f"': "1.50"}))
    tests = [unit_test(config, "ArgusStragglerRank: the scorer's finding, after `for`", series,
                   alerts=fires(config, "ArgusStragglerRank", 0, config.for_straggler,
                                 [expected]))]

    # A healthy job: the scorer publishes its statistics and no finding; a rank 3x its
    # group in the exporters' phases alone (no scorer finding) is not the alerts' business.
    series = []
    for rank in range(4):
        labels = rank_labels(config, "healthy", rank, dp=rank)
        series.append(Series("argus_phase_window_seconds",
                             {**labels, "phase": "mlp", "stat": "median"},
                             [0.375 if rank == 3 else 0.125] * samples))
    series.append(Series("argus_l2_group_median_seconds",
                         {**matchers(config.selectors.scorer), "job": "healthy",
                          "axis": "dp", "phase": "mlp", "tp": "0", "pp": "0", "ep": "0"},
                         [0.125] * samples))
    series.append(Series("argus_scorer_l2_tests", {**matchers(config.selectors.scorer),
                                                    "job": "healthy"}, [4.0] * samples))
    tests.append(unit_test(config, "ArgusStragglerRank: nothing without a scorer finding",
                       series, alerts=[check(config, k, "ArgusStragglerRank", [])
                                       for k in (samples // 2, samples - 1)]))

    # The scorer goes stale mid-incident: its scrape fails (up 0, staleness markers on its
    # series); the L2 alert goes with its finding and ArgusScorerStale takes over.
    stale_rule = rule_named(groups, "ArgusScorerStale")
    due = intervals(config, config.for_straggler)
    dies = due + 2
    down = intervals(config, config.for_component_down)
    samples = dies + down + 3
    scorer = {**matchers(config.selectors.scorer_up), **matchers(config.selectors.scorer),
              "instance": "node-0:9800"}
    success = [k * config.evaluation_interval for k in range(dies)]
    series = [
        Series("argus_phase_straggler_ratio", {**straggler, "kind": "compute"},
               [1.5] * dies + ["stale"] * (samples - dies)),
        Series("argus_scorer_last_success_timestamp_seconds", scorer,
               success + ["stale"] * (samples - dies)),
        Series("up", scorer, [1.0] * dies + [0.0] * (samples - dies))]
    stale = expect(alert_labels(config, stale_rule, **scorer),  # `up == 0`'s labels
                    annotations(stale_rule, **{"$labels.instance": "node-0:9800"}))
    tests.append(unit_test(config, "ArgusScorerStale, and no L2 alert, when the scorer stops",
                       series, alerts=[
                           check(config, due, "ArgusStragglerRank", [expected]),
                           check(config, dies, "ArgusStragglerRank", []),
                           check(config, samples - 1, "ArgusStragglerRank", []),
                           *fires(config, "ArgusScorerStale", dies,
                                   config.for_component_down, [stale])]))
    return tests


def l2_promql_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """``l2_source: promql``: the rules' comparison (a compute straggler in a dp group of
    four; its peers' waiting in the all-reduce is not slowness; a rank halfway to the
    threshold raises nothing; the same straggler in a job whose step is so long that its
    excess costs less than ``min_cost_share`` of it raises nothing either; a rank between the
    device and the host clock's thresholds fires where its exporters time on a device and not
    where they time on the host clock)."""
    onset = 0
    samples = intervals(config, config.for_straggler) + 2
    series: list[Series] = []
    base = 0.125
    # dp group of four: 4 mlp statistics and 4 dp-allreduce ones; nothing on other axes.
    margin = l2_margin(config, tests=8)
    slow = base * math.exp(margin) * 1.5
    # The job's step (its slowest rank's median): the excess costs 20x the floor in "train"
    # and half of it in "cheap".
    costly_step = (slow - base) / (20 * config.min_cost_share)
    for job, step_s in (("train", costly_step), ("cheap", 40 * costly_step)):
        for rank in range(4):
            labels = rank_labels(config, job, rank, dp=rank)
            mlp = slow if rank == 3 else base
            wait = 0.0 if rank == 3 else slow - base
            series.append(Series("argus_steps_total", labels,
                                 [100.0 + k for k in range(samples)]))
            series.append(Series("argus_step_window_seconds", {**labels, "stat": "median"},
                                 [step_s] * samples))
            series.append(Series("argus_phase_window_seconds",
                                 {**labels, "phase": "mlp", "stat": "median"}, [mlp] * samples))
            series.append(Series("argus_phase_window_seconds",
                                 {**labels, "phase": "dp-allreduce", "stat": "median"},
                                 [0.0625 + wait] * samples))
    near = base * math.exp(l2_margin(config, tests=4) / 2)  # halfway: no alert
    for rank in range(4):
        labels = rank_labels(config, "fine", rank, dp=rank)
        series.append(Series("argus_steps_total", labels, [100.0 + k for k in range(samples)]))
        series.append(Series("argus_step_window_seconds", {**labels, "stat": "median"},
                             [costly_step] * samples))
        series.append(Series("argus_phase_window_seconds",
                             {**labels, "phase": "mlp", "stat": "median"},
                             [near if rank == 3 else base] * samples))
    between = base * math.exp((margin + host_l2_margin(config, tests=4)) / 2)
    for job, clock in (("on-device", "device"), ("on-host", "host")):
        for rank in range(4):
            labels = rank_labels(config, job, rank, dp=rank)
            series.append(Series("argus_steps_total", labels,
                                 [100.0 + k for k in range(samples)]))
            series.append(Series("argus_step_window_seconds", {**labels, "stat": "median"},
                                 [costly_step] * samples))
            series.append(Series("argus_phase_window_seconds",
                                 {**labels, "phase": "mlp", "stat": "median"},
                                 [between if rank == 3 else base] * samples))
            series.append(Series("argus_phase_clock_info", {**labels, "clock": clock},
                                 [1.0] * samples))
    rule = rule_named(groups, "ArgusStragglerRank")

    def straggler(job: str, ratio: float) -> dict:
        labels = rank_labels(config, job, 3, dp=3)
        return expect(
            alert_labels(config, rule, **labels, phase="mlp", axis="dp"),
            annotations(rule, **{"$labels.rank": "3", "$labels.host": "node-0",
                                  "$labels.job": job, "$labels.axis": "dp",
                                  "$labels.phase": "mlp",
                                  '$value | printf "%.2f"': f"{ratio:.2f}"}))

    return [unit_test(config, "ArgusStragglerRank: the slow rank, not the ranks waiting for it, "
                  "only where its excess costs the job, on its clock's threshold", series,
                  alerts=fires(config, "ArgusStragglerRank", onset, config.for_straggler,
                                [straggler("train", slow / base),
                                 straggler("on-device", between / base)]))]


def l2_scorer_finding_tests(config: RulesConfig, groups: list[dict]) -> list[dict]:
    """The scorer's findings in either mode: a pair member (ArgusStragglerRank), a rank short
    of CPU (ArgusRankShortOfCPU) and a collective slow with nobody arriving late
    (ArgusLinkDegraded)."""
    onset = 0
    samples = intervals(config, config.for_straggler) + 2
    rule = rule_named(groups, "ArgusStragglerRank")
    tests = []
    pair = scorer_labels(config, "pairs", 1, "mlp", "tp", tp=1)
    series = [Series("argus_phase_straggler_ratio", {**pair, "kind": "compute"},
                     [2.0] * samples)]
    tests.append(unit_test(config, "ArgusStragglerRank: the scorer's pair member", series,
                       alerts=fires(config, "ArgusStragglerRank", onset,
                                     config.for_straggler, [expect(
                                         alert_labels(config, rule, **pair),
                                         annotations(rule, **{
                                             "$labels.rank": "1", "$labels.host": "node-0",
                                             "$labels.job": "pairs", "$labels.axis": "tp",
                                             "$labels.phase": "mlp",
                                             '$value | printf "%.2f"': "2.00"}))])))

    tests.append(short_of_cpu_test(config, groups))

    rule = rule_named(groups, "ArgusLinkDegraded")
    series, link = [], []
    for rank in range(6):
        dp, tp = divmod(rank, 2)
        labels = scorer_labels(config, "links", rank, "tp-comm", "tp", dp=dp, tp=tp)
        if dp == 2:
            series.append(Series("argus_phase_straggler_ratio",
                                 {**labels, "kind": "communication"}, [3.0] * samples))
            link.append(expect(alert_labels(config, rule, **labels), annotations(rule, **{
                "$labels.rank": str(rank), "$labels.host": "node-0",
                "$labels.job": "links", "$labels.axis": "tp", "$labels.phase": "tp-comm",
                '$value | printf "%.2f"': "3.00"})))
    series.append(Series("argus_phase_straggler_ratio",  # a compute finding: not a link
                         {**scorer_labels(config, "links", 0, "mlp", "tp"), "kind": "compute"},
                         [2.0] * samples))
    tests.append(unit_test(config, "ArgusLinkDegraded: the scorer's slow collective transfer",
                       series, alerts=fires(config, "ArgusLinkDegraded", onset,
                                             config.for_straggler, link)))
    return tests


def short_of_cpu_test(config: RulesConfig, groups: list[dict]) -> dict:
    """A rank whose slow phase its wait for a CPU explains (the scorer's
    ``argus_rank_short_of_cpu_seconds``): ArgusRankShortOfCPU after ``for``, and no
    ArgusStragglerRank for it, while another rank's compute finding in the same job still
    raises one."""
    samples = intervals(config, config.for_straggler) + 2
    rule = rule_named(groups, "ArgusRankShortOfCPU")
    starved = scorer_labels(config, "shared", 1, "mlp", "dp", dp=1)
    slow = scorer_labels(config, "shared", 2, "mlp", "dp", dp=2)
    cpu = {**matchers(config.selectors.scorer), "job": "shared", "rank": "1", "host": "node-0"}
    series = [Series("argus_phase_straggler_ratio", {**starved, "kind": "compute"},
                     [1.8] * samples),
              Series("argus_phase_straggler_ratio", {**slow, "kind": "compute"},
                     [1.5] * samples),
              Series("argus_rank_short_of_cpu_seconds", cpu, [0.025] * samples)]
    expected = expect(alert_labels(config, rule, **cpu), annotations(rule, **{
        "$labels.rank": "1", "$labels.host": "node-0", "$labels.job": "shared",
        "$value | humanizeDuration": humanize_duration(0.025)}))
    straggler = rule_named(groups, "ArgusStragglerRank")
    only_slow = expect(alert_labels(config, straggler, **slow), annotations(straggler, **{
        "$labels.rank": "2", "$labels.host": "node-0", "$labels.job": "shared",
        "$labels.axis": "dp", "$labels.phase": "mlp", '$value | printf "%.2f"': "1.50"}))
    return unit_test(config, "ArgusRankShortOfCPU: the rank its CPU wait explains, and not "
                     "as a straggler", series,
                     alerts=[*fires(config, "ArgusRankShortOfCPU", 0, config.for_straggler,
                                    [expected]),
                             *fires(config, "ArgusStragglerRank", 0, config.for_straggler,
                                    [only_slow])])
