"""Recording rules: L1 (the job's iteration time), L2 (group medians, pooled spreads and the
family-wise threshold) and pipeline health, named ``level:metric:operations``.

Only small results are recorded: per job, per axis group, per instance. Per-rank ratios are
computed where they are used (the alert expressions and dashboards), after a comparison
with a small recorded threshold has already cut the 10,000-rank vectors down to the ranks
that stand out.

What the rules compute is the core's statistics (argus_core.detect), with its thresholds
(``RulesConfig`` reads them from ``L1Config`` and ``L2Config``), where PromQL can express
them, and the closest causal equivalent where it cannot:

- L1 iteration time is the slowest rank's: ``max by (job)`` of each rank's mean step time
  (counters) and of its rolling-window gauges (last ``exporter_window_steps`` steps).
- L1 spike: the core compares a step with the *centred* rolling median of 9 steps; a causal
  rule only sees the past, so a spike is the window's slowest step over the window's median,
  and a level shift (a regression's first steps also look like "one slow step") is told apart
  by the steps since the previous scrape still being slow (above ``spike_guard``, halfway to
  the spike ratio): only the ``settled_ratio`` counts. Warm-up steps are excluded the way
  the core excludes them: a rank is judged once its window holds none of them.
- L1 regression: the core finds change points over the whole run (binary segmentation) in
  units of the job's own noise; the rules compare the median iteration time of the recent
  window with the job's best pace (the lowest such median) over the ``regression_baseline``
  before it, so a slowdown that lasts never becomes its own baseline, and page when the
  ratio reaches ``min_regression`` and ``regression_z`` robust standard deviations of how
  much the recent median moves from one window to the next (the core's noise from first
  differences: a level shift moves one of them), read over the baseline's span.
- L2, compute phases, on the axes in ``axes`` (dp, tp, ep), groups of three or more: the
  core's statistic for a metrics snapshot (``detect/l2.py``, a single "step" of per-rank
  medians): ``s = ln(time / group median)`` with each rank's median of its last steps,
  ``sigma = max(1.4826 MAD, scale_floor)`` with the MAD pooled over every rank compared on
  the axis (used from ``l2_min_pool`` ranks on), and a rank is flagged when
  ``s >= max(ln(min_ratio), z_family x sigma)``, ``z_family = max(l2_z, Phi^-1(1 - alpha /
  N))``. N, every statistic the core judges in the job (compute phases of every rank in
  groups of two or more on every axis, each axis's collectives of ranks in groups of three or
  more, and each axis's groups when there are three or more), is counted with ``count()``;
  Phi^-1 is Acklam's rational approximation (relative error 1e-9 below alpha/N = 0.024).
  Differences by construction: the core takes the median over steps of per-step ratios
  (the rules the ratio of per-rank medians over the rolling window), widens the floor by
  each rank's own step-to-step noise (the rules see no per-step values; the pooled MAD
  covers the ranks' spread), takes the MAD around the statistics' median (the rules around
  0, which that median is up to sampling error: every group's median is subtracted), finds
  each rank's onset (the rules' rolling window is itself "the last steps": a slowdown counts
  once it fills half the window), and counts N for pipeline stages split by likeness.
- Everything else of L2 is the scorer's (``argus score``, ``argus_core.score.core_adapter``),
  which runs the core's own L2 on the same phase medians and publishes the findings as
  ``argus_phase_straggler_ratio{kind}``: pairs (PromQL has no "the partner waits for it"),
  the pipeline axis (which stages are alike comes from the kernels the processors see),
  and every collective comparison (waiting measured from arrival skew needs the phases in
  step order, ``argus_phase_order_info``; the scorer also publishes it per rank as
  ``argus_rank_wait_seconds``). The alerts take the union.
- With ``l2_source: scorer`` (the default) no L2 runs in PromQL: the scorer runs the core's L2
  on every axis, ArgusStragglerRank reads its findings, and ``argus.l2`` records only its small
  statistics (``l2_scorer_group``); the groups' medians and thresholds are read from the
  scorer where they are shown (``group_statistic``).

Recorded rules chain at most two deep (a rule over the exporters' series, then one over
those) below what an alert reads. On victoria-metrics a rule reads what vmalert wrote back
only once the store shows it: a sample once it is ``-search.latencyOffset`` old (the scrape
interval, as the stack starts it), a new series' first sample about 10 s after it arrives,
whichever is later (``bench/vm_visibility.py``). Each recorded level in between lags an
alert by that much, and over a new job's series on the stack's fast clock by 10 s a level.
The job-level references ArgusHostStall compares a rank with are aggregated inside its
excess rule, and the settled spike ratio repeats the ratio's expression, instead of reading
further levels.
"""

from __future__ import annotations

import math

from argus_core.rules.config import L2_PROMQL, RulesConfig, format_duration
from argus_core.rules.promql import (
    all_axis_phases,
    compute_phases,
    group_labels,
    indent,
    not_point_to_point,
    select,
)
from argus_core.schema import AXES
from argus_core.stats.robust import MAD_TO_SIGMA

STAT_MAX = 'stat="max"'
STAT_MEDIAN = 'stat="median"'


def recording_groups(config: RulesConfig) -> list[dict]:
    """Every recording-rule group."""
    l2 = l2_group(config) if config.l2_source == L2_PROMQL else l2_scorer_group(config)
    return [l1_group(config), l1_trend_group(config), l2, pipeline_group(config)]


def _group(name: str, interval: float, rules: list[dict]) -> dict:
    return {"name": name, "interval": format_duration(interval), "rules": rules}


def _record(name: str, expr: str, **labels: str) -> dict:
    rule = {"record": name, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule


def _max(by: str, *parts: tuple[str, str]) -> str:
    """Element-wise maximum of vectors with the same labels, each evaluated once: tag each with
    its own ``part`` label, take their union, and ``max by`` the shared labels."""
    tagged = [f'label_replace({expr}, "part", "{tag}", "", "")' for tag, expr in parts]
    return f"max by ({by}) (\n  " + "\nor\n  ".join(tagged) + "\n)"


def l1_group(config: RulesConfig) -> dict:
    """Every evaluation: the rolling windows' slowest step and median, the spike ratios, the
    steps since the previous scrape, and the host time ArgusHostStall compares ranks on."""
    sel = config.selectors.exporters
    rate = format_duration(config.rate_window)
    steps, seconds = (select("argus_steps_total", sel),
                      select("argus_step_seconds_total", sel))
    gpu = select("argus_step_gpu_seconds_total", sel)
    window = "argus_step_window_seconds"
    host = format_duration(config.host_window)
    spike_ratio = ("job:argus_step_window_seconds:max / job:argus_step_window_seconds:median\n"
                   f"and on (job) job:argus_steps:min >= {config.judged_steps}")
    return _group("argus.l1", config.evaluation_interval, [
        # The steps since the previous scrape (irate), or the rate window's when no step ended
        # in between: still slow means a level shift, not a spike.
        _record("job:argus_iteration_seconds:latest",
                f"max by (job) (irate({seconds}[{rate}]) / (irate({steps}[{rate}]) > 0))\n"
                f"or job:argus_iteration_seconds:max_rate"),
        _record("job:argus_step_window_seconds:max",
                f"max by (job) ({select(window, STAT_MAX, sel)})"),
        _record("job:argus_step_window_seconds:median",
                f"max by (job) ({select(window, STAT_MEDIAN, sel)})"),
        _record("job:argus_steps:min", f"min by (job) ({steps})"),
        _record("job:argus_iteration_spike:ratio", spike_ratio),
        # The job's own noise: its usual window ratio (a noisy job's rolling window always
        # holds a blip of 2x; a quiet one's stays near 1).
        _record("job:argus_iteration_spike:typical_ratio",
                "quantile_over_time(0.5, job:argus_iteration_spike:ratio"
                f"[{format_duration(config.spike_history)}])"),
        # The spike ratio once the job is back to its pace: the steps since the previous scrape
        # are below `spike_guard` x the rolling median. While a level shift is under way they
        # stay above it, and its first slow steps are not reported as a spike.
        _record("job:argus_iteration_spike:settled_ratio",
                f"(\n{indent(spike_ratio)}\n)\n"
                "unless on (job)\n"
                f"  job:argus_iteration_seconds:latest >= {config.spike_guard:g} * "
                "job:argus_step_window_seconds:median"),
        # Host time (wall - GPU) each rank spent over the window, computed once (the two
        # increases over every rank are this group's costliest reads).
        _record("rank:argus_host_seconds:increase",
                f"increase({seconds}[{host}]) - increase({gpu}[{host}])"),
        # A rank's extra host time over the lower of two references: the job's median rank
        # and the mean of the other ranks (a pair: its partner, as the core compares pairs;
        # the median of two ranks is their midpoint and would halve a stall). Over the mean
        # of the n - 1 others, x - (sum - x) / (n - 1) = (x - mean) / (1 - 1/n). The two
        # excesses are told apart by a `reference` label and the larger kept: five reads of
        # the ranks' host time where `a > b or b` took ten. The job's references are
        # aggregated here, not recorded apart (see the module doc). A one-rank job: 0.
        _record("rank:argus_host_seconds:excess_increase",
                "max without (reference) (\n"
                f"  {_HOST}\n"
                f"  - on (job) group_left quantile by (job) (0.5, {_HOST})\n"
                "  or\n"
                "  label_replace(\n"
                f"    ({_HOST} - on (job) group_left avg by (job) ({_HOST}))\n"
                f"    / on (job) group_left () (1 - 1 / count by (job) ({_HOST})),\n"
                '    "reference", "others", "", ""\n'
                "  )\n"
                ")"),
    ])


_HOST = "rank:argus_host_seconds:increase"


def l1_trend_group(config: RulesConfig) -> dict:
    """Every ``slow_interval``: the job's mean iteration time from the counters, its median
    over the recent window, the best such median before it, their ratio, and the ratio a
    regression must reach: ``min_regression`` or ``regression_z`` standard deviations of the
    job's own window-to-window wander (a finer refresh would change nothing)."""
    sel = config.selectors.exporters
    rate = format_duration(config.rate_window)
    recent, two_windows, baseline = (format_duration(config.regression_recent),
                                     format_duration(2 * config.regression_recent),
                                     format_duration(config.regression_baseline))
    steps, seconds = (select("argus_steps_total", sel),
                      select("argus_step_seconds_total", sel))
    return _group("argus.l1.trend", config.slow_interval, [
        _record("job:argus_iteration_seconds:max_rate",
                f"max by (job) (rate({seconds}[{rate}]) / rate({steps}[{rate}]))"),
        _record("job:argus_iteration_seconds:recent_median",
                "quantile_over_time(0.5, job:argus_iteration_seconds:max_rate"
                f"[{format_duration(config.regression_recent)}])"),
        # The job's best pace before the recent window: the lowest recent median. A
        # slowdown that lasts never becomes its own baseline (a median over the hour before
        # would absorb it after half an hour and page "resolved" while the job is slow).
        _record("job:argus_iteration_seconds:baseline_median",
                "min_over_time(job:argus_iteration_seconds:recent_median"
                f"[{format_duration(config.regression_baseline)}] offset "
                f"{format_duration(config.regression_recent)})"),
        _record("job:argus_iteration_regression:ratio",
                "job:argus_iteration_seconds:recent_median\n"
                "/ job:argus_iteration_seconds:baseline_median"),
        # The job's own wander: how much the recent median moves from one recent window to
        # the next (a level shift moves one such change, so a regression does not widen it),
        # read over the baseline's span and as a robust standard deviation (1.4826 MAD of a
        # difference of two, / sqrt 2). Only between two full windows (the job had a pace
        # two windows ago), and judged once it holds a recent window of changes.
        _record("job:argus_iteration_seconds:recent_log_change",
                "abs(ln(job:argus_iteration_seconds:recent_median)\n"
                f"    - ln(job:argus_iteration_seconds:recent_median offset {recent}))\n"
                "and on (job)\n"
                f"  job:argus_iteration_seconds:max_rate offset {two_windows}"),
        _record("job:argus_iteration_seconds:recent_log_noise",
                f"{MAD_TO_SIGMA / math.sqrt(2):.6g} * quantile_over_time(0.5,\n"
                f"  job:argus_iteration_seconds:recent_log_change[{baseline}] offset {recent})\n"
                "and on (job)\n"
                "  count_over_time(job:argus_iteration_seconds:recent_log_change"
                f"[{baseline}] offset {recent})\n"
                f"  >= {noise_samples(config)}"),
        # The ratio a regression reaches: min_regression, or regression_z of the job's own
        # wander when that is wider (a CPU job whose pace wanders 16% is not paged for it).
        _record("job:argus_iteration_regression:threshold",
                f"clamp_min(exp({config.regression_z:g} * "
                "job:argus_iteration_seconds:recent_log_noise), "
                f"{config.min_regression:g})"),
    ])


def regression_warmup(config: RulesConfig) -> float:
    """Job time before ArgusIterationRegression can fire: two full recent windows before the
    first change of the recent median, ``noise_samples`` of them, and the recent window the
    noise leaves out (about four recent windows)."""
    return (2 * config.regression_recent + noise_samples(config) * config.slow_interval
            + config.regression_recent)


def noise_samples(config: RulesConfig) -> int:
    """Changes of the recent median the regression's noise needs before the job is judged:
    a recent window of them (the job has then run four recent windows)."""
    return max(3, round(config.regression_recent / config.slow_interval))


# The scorer's L2 statistics -> the names the dashboards and alerts read (l2_source scorer),
# with the labels that identify them: the small ones, per job or per axis and phase.
SCORER_L2 = (
    ("job_phase:argus_phase_log_ratio:scale", "argus_l2_log_ratio_scale", "job, axis, phase"),
    ("job:argus_l2_z:family", "argus_l2_z_family", "job"),
    ("job:argus_l2_tests:count", "argus_scorer_l2_tests", "job"),
)
# Per axis group and phase, the statistic's recorded name (l2_source promql) and the scorer's
# own series: not re-recorded in scorer mode (one series per group and phase, ~20,000 at
# 10,000 ranks); ``group_statistic`` reads whichever the Prometheus holds.
GROUP_STATISTICS = {
    "median": ("axis_group:argus_phase_seconds:median", "argus_l2_group_median_seconds"),
    "threshold": ("axis_group:argus_phase_seconds:threshold",
                  "argus_l2_group_threshold_seconds"),
}
GROUP_KEY = f"job, axis, phase, {', '.join(AXES)}"
"""What identifies an axis group's statistic (a coordinate the group lacks is no label)."""


def group_statistic(statistic: str, matchers: str) -> str:
    """PromQL for each axis group's ``median`` or ``threshold`` per compute phase, in either L2
    mode: the ``promql`` rules' recorded series or, where there is none, the scorer's own,
    both reduced to ``GROUP_KEY`` (``matchers``: the inside of a selector, e.g.
    ``job="x", axis="dp"``)."""
    recorded, published = GROUP_STATISTICS[statistic]
    return (f"max by ({GROUP_KEY}) ({recorded}{{{matchers}}}"
            f" or on ({GROUP_KEY}) {published}{{{matchers}}})")


def l2_scorer_group(config: RulesConfig) -> dict:
    """``l2_source: scorer``: the core's small L2 statistics, as the scorer publishes them, under
    the names ``l2_group`` records (per job; per axis and phase for the ``axes`` the dashboards
    show). The groups' medians and thresholds are read from the scorer where they are used
    (``group_statistic``): re-recording ~20,000 series a minute at 10,000 ranks would only
    copy them. The alerts read the scorer's findings; nothing here reads the ranks' phases."""
    sel = config.selectors.scorer
    axes = f'axis=~"{"|".join(config.axes)}"'  # the dashboards' axes; the alerts read all
    return _group("argus.l2", config.slow_interval, [
        _record(name, f"max by ({labels}) "
                      f"({select(source, axes if 'axis' in labels else '', sel)})")
        for name, source, labels in SCORER_L2])


def l2_group(config: RulesConfig) -> dict:
    """Every ``slow_interval`` (the phase medians cover the last 32 steps), in order: each
    axis's group sizes, then per compared axis the groups' medians, the family-wise z over
    everything the job judges, and per compared axis the pooled spread and the threshold.

    Cost: per compared axis two passes over every rank's compute-phase medians (the median,
    then the spread around it) and the alert one more; one pass over the collectives'
    medians and one over the step counters per axis to count what is judged."""
    sel = config.selectors.exporters
    phases = select("argus_phase_window_seconds", STAT_MEDIAN, compute_phases(), sel)
    steps = select("argus_steps_total", sel)
    rules = [_record("axis_group:argus_ranks:count", f"count by ({group_labels(axis)}) ({steps})",
                     axis=axis) for axis in AXES]
    for axis in config.axes:
        rules.append(_record(
            "axis_group:argus_phase_seconds:median",
            f"quantile by ({group_labels(axis, 'phase')}) (0.5, {phases})\n"
            f"and on ({group_labels(axis)})\n"
            f"axis_group:argus_ranks:count{on_axis(axis)} >= 3", axis=axis))
    rules += family_rules(config)
    for axis in config.axes:
        rules += spread_rules(config, axis, phases)
    return _group("argus.l2", config.slow_interval, rules)


def on_axis(axis: str) -> str:
    """The matcher of one axis's recorded series."""
    return f'{{axis="{axis}"}}'


def family_rules(config: RulesConfig) -> list[dict]:
    """N, the number of statistics the core's L2 judges in the job, and the family-wise z.

    Per axis: compute phases of ranks in groups of two or more, the axis's own collectives
    (``{axis}-*`` but sends and recvs) of ranks in groups of three or more, and one statistic
    per group and collective when the axis has three groups or more (and more than one
    position)."""
    sel = config.selectors.exporters
    collectives = select("argus_phase_window_seconds", STAT_MEDIAN, all_axis_phases(),
                         not_point_to_point(), sel)
    parts = []
    for axis in AXES:
        sizes = f"axis_group:argus_ranks:count{on_axis(axis)}"
        own = f"job_axis:argus_collective_phases:count{on_axis(axis)}"
        parts += [
            (f"{axis}_compute", f"sum by (job) ({sizes} >= 2)\n"
                                f"  * on (job) job:argus_compute_phases:count"),
            (f"{axis}_collectives", f"sum by (job) ({sizes} >= 3)\n"
                                    f"  * on (job) group_left {own}"),
            (f"{axis}_groups", f"(count by (job) ({sizes}) >= 3)\n"
                               f"  * on (job) group_left {own}\n"
                               f"  and on (job) max by (job) ({sizes}) >= 2"),
        ]
    alpha_over_n = f"{config.l2_alpha!r} / job:argus_l2_tests:count"
    return [
        _record("job:argus_compute_phases:count",
                "count by (job) (count by (job, phase) (axis_group:argus_phase_seconds:median))"),
        _record("job_axis:argus_collective_phases:count",
                'count by (job, axis) (label_replace(\n'
                f"  count by (job, phase) ({collectives}),\n"
                f'  "axis", "$1", "phase", "({"|".join(AXES)})-.*"\n))'),
        _record("job:argus_l2_tests:count", _sum("job", *parts)),
        _record("job:argus_l2_z:family",
                f"clamp_min(\n{indent(normal_upper_quantile(alpha_over_n))},\n"
                f"  {config.l2_z!r}\n)"),
    ]


# Acklam's inverse normal CDF, lower tail (p < 0.02425): x = C(q) / D(q), q = sqrt(-2 ln p).
_ACKLAM_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
             -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_ACKLAM_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
             3.754408661907416e+00, 1.0)


def normal_upper_quantile(p: str) -> str:
    """PromQL for Phi^-1(1 - p) of a vector ``p`` (Acklam's rational approximation of the
    lower tail, negated: relative error below 1.2e-9 for p < 0.02425, where every
    family-wise level of a job lies; PromQL has no inverse normal)."""
    q = f"sqrt(-2 * ln({p}))"

    def horner(coefficients: tuple[float, ...]) -> str:
        text = f"{coefficients[0]!r}"
        for c in coefficients[1:]:
            text = f"({text}) * {q} + {c!r}"
        return text

    return f"-(\n  {horner(_ACKLAM_C)}\n)\n/ (\n  {horner(_ACKLAM_D)}\n)"


def spread_rules(config: RulesConfig, axis: str, phases: str) -> list[dict]:
    """The pooled spread of ``ln(time / group median)`` over the axis's ranks (per job and
    phase) and each group's threshold: ``median x exp(max(ln(min_ratio), z_family x
    sigma))``, so that a rank above it passes both of the core's tests."""
    group = group_labels(axis, "phase")
    median = f"axis_group:argus_phase_seconds:median{on_axis(axis)}"
    pooled = f"sum by (job) (axis_group:argus_ranks:count{on_axis(axis)} >= 3)"
    mad = (f"quantile by (job, phase) (0.5, abs(\n    ln({phases})\n"
           f"    - on ({group}) group_left\n    ln({median})\n  ))\n"
           f"  and on (job) {pooled} >= {config.l2_min_pool}")
    scale = f"job_phase:argus_phase_log_ratio:scale{on_axis(axis)}"
    margin = (f"clamp_min(\n  {scale}\n  * on (job) group_left job:argus_l2_z:family,\n"
              f"  {math.log(config.l2_min_ratio)!r}\n)")
    clock = select("argus_phase_clock_info", config.selectors.exporters)
    host = select("argus_phase_clock_info", config.selectors.exporters, 'clock="host"')
    on_host = f"2 * count by (job) ({host}) > count by (job) ({clock})"
    return [
        _record("job_phase:argus_phase_log_ratio:scale",
                _max("job, phase", ("mad", f"{MAD_TO_SIGMA} * {mad}"),
                     ("floor", f"{config.l2_scale_floor!r} + 0 * max by (job, phase) "
                               f"({median})"),
                     ("host_floor", f"({config.l2_host_scale_floor!r} + 0 * max by (job, phase) "
                                    f"({median})) and on (job) ({on_host})")), axis=axis),
        _record("axis_group:argus_phase_seconds:threshold",
                f"{median}\n* on (job, phase) group_left\nexp(\n{indent(margin)}\n)",
                axis=axis),
    ]


def _sum(by: str, *parts: tuple[str, str]) -> str:
    """Sum of vectors with the same labels where a missing one counts as nothing (``+``
    would drop the job): tag each with its own ``part`` label and ``sum by`` the rest."""
    tagged = [f'label_replace(\n{indent(expr)},\n  "part", "{tag}", "", "")'
              for tag, expr in parts]
    return f"sum by ({by}) (\n" + indent("\nor\n".join(tagged)) + "\n)"


def pipeline_group(config: RulesConfig) -> dict:
    """When each rank last reported, exporter drops and queues, processor intake (records,
    kernel events, late drops) and uploads, scorer freshness."""
    sel = config.selectors
    window = format_duration(max(config.rate_window, 4 * config.scrape_interval))
    steps = select("argus_steps_total", sel.exporters)
    return _group("argus.pipeline", config.slow_interval, [
        # When each rank last reported (the scrape's timestamp), kept by reading this series'
        # own previous value once the rank's counter is gone, for `silent_window`: what
        # ArgusExporterDown compares the live counters with. One instant read of every rank
        # instead of a `last_over_time` over `silent_window` of samples (240 a rank at 15 s),
        # every `slow_interval` (the alert waits `for_exporter_down`, minutes, anyway).
        _record("rank:argus_steps:last_seen_timestamp",
                f"max by (job, rank, host, instance) (timestamp({steps}))\n"
                "or\n"
                f"rank:argus_steps:last_seen_timestamp > time() - {config.silent_window:g}"),
        _record("job:argus_exporter_dropped_records:rate",
                "sum by (job, reason) (rate("
                f"{select('argus_exporter_dropped_records_total', sel.exporters)}[{window}]))"),
        _record("job:argus_exporter_export_failures:rate",
                "sum by (job) (rate("
                f"{select('argus_exporter_export_failures_total', sel.exporters)}[{window}]))"),
        _record("job:argus_exporter_queue_depth:max",
                f"max by (job) ({select('argus_exporter_queue_depth', sel.exporters)})"),
        _record("job:argus_exporter_targets_up:ratio",
                f"avg by (job) ({select('up', sel.exporters_up)})"),
        _record("instance:argus_processor_records:rate",
                "sum by (instance) (rate("
                f"{select('argus_processor_records_total', sel.processor)}[{window}]))"),
        _record("instance:argus_processor_kernel_events:rate",
                "sum by (instance) (rate("
                f"{select('argus_processor_kernel_events_total', sel.processor)}[{window}]))"),
        _record("instance:argus_processor_late:rate",
                "sum by (instance, kind) (rate("
                f"{select('argus_processor_late_total', sel.processor)}[{window}]))"),
        _record("instance:argus_processor_rejected_records:rate",
                "sum by (instance, reason) (rate("
                f"{select('argus_processor_rejected_records_total', sel.processor)}"
                f"[{window}]))"),
        _record("instance:argus_processor_upload_failures:rate",
                "sum by (instance) (rate("
                f"{select('argus_processor_upload_failures_total', sel.processor)}"
                f"[{window}]))"),
        _record("instance:argus_scorer_last_success:age_seconds",
                "time() - max by (instance) ("
                f"{select('argus_scorer_last_success_timestamp_seconds', sel.scorer)})"),
    ])
