"""Recording rules: L1 (the job's iteration time), L2 (group medians and spreads per axis) and
pipeline health, named ``level:metric:operations``.

Only small results are recorded: per job, per axis group, per instance. Per-rank ratios and z
scores are computed where they are used (the alert expressions and dashboards), after a
comparison has already cut the 10,000-rank vectors down to the few ranks that stand out.

What the rules compute is the core's statistics (argus_core.detect) where PromQL can express
them, and the closest causal equivalent where it cannot:

- L1 iteration time is the slowest rank's: ``max by (job)`` of each rank's mean step time
  (counters) and of its rolling-window gauges (last ``exporter_window_steps`` steps).
- L1 spike: the core compares a step with the *centred* rolling median of 9 steps; a causal
  rule only sees the past, so a spike is the window's slowest step over the window's median,
  and a level shift (a regression's first steps also look like "one slow step") is told apart
  by the steps since the previous scrape still being slow (above ``spike_guard``, halfway to
  the spike ratio): only the ``settled_ratio`` counts. Warm-up steps are excluded the way
  the core excludes them: a rank is judged once its window holds none of them.
- L1 regression: the core finds change points over the whole series (binary segmentation);
  the rules compare the median iteration time of a recent window with the one before it.
- L2: a rank's phase time (the median of its last steps, as the core takes the median of the
  steady steps) against its axis group: ``median`` over the group, MAD spread with the core's
  2% floor, and a threshold ``max(min_ratio x median, median + z x scale)`` per group.
  Differences from the core, by construction: the core divides by the median of the *other*
  members (PromQL has no leave-one-out), which moves ratios near the threshold only; groups of
  two are never flagged here (with the median of two the robust z cannot exceed 0.68), while
  the core flags a pair member when its partner is seen waiting for it; and the core's
  family-wise corrections are not applied. The scorer (``argus score``) runs the core's own
  L2 on the same phase medians and exports what PromQL cannot: ``argus_verdict`` per rank and
  ``argus_rank_wait_seconds`` (waiting measured from arrival skew).
- Waiting inside a collective is never read as slowness: the compute comparison uses compute
  phases only; a collective phase is judged per group by the group's *shortest* time (its last
  arriver's), against the other groups of the axis, as the core does.
"""

from __future__ import annotations

from argus_core.rules.config import RulesConfig, format_duration
from argus_core.rules.promql import (
    axis_phases,
    compute_phases,
    group_labels,
    select,
)
from argus_core.stats.robust import MAD_TO_SIGMA

STAT_MAX = 'stat="max"'
STAT_MEDIAN = 'stat="median"'


def recording_groups(config: RulesConfig) -> list[dict]:
    """Every recording-rule group."""
    return [l1_group(config), l1_trend_group(config),
            *(l2_group(config, axis) for axis in config.axes), pipeline_group(config)]


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
        _record("job:argus_iteration_spike:ratio",
                "job:argus_step_window_seconds:max / job:argus_step_window_seconds:median\n"
                f"and on (job) job:argus_steps:min >= {config.judged_steps}"),
        # The spike ratio once the job is back to its pace: the steps since the previous scrape
        # are below `spike_guard` x the rolling median. While a level shift is under way they
        # stay above it, and its first slow steps are not reported as a spike.
        _record("job:argus_iteration_spike:settled_ratio",
                "job:argus_iteration_spike:ratio\n"
                "unless on (job)\n"
                f"  job:argus_iteration_seconds:latest >= {config.spike_guard:g} * "
                "job:argus_step_window_seconds:median"),
        # Host time (wall - GPU) each rank spent over the window; its job median is the
        # reference ArgusHostStall compares one rank with.
        _record("job:argus_host_seconds:median_increase",
                f"quantile by (job) (0.5, increase({seconds}[{host}]) - increase({gpu}[{host}]))"),
    ])


def l1_trend_group(config: RulesConfig) -> dict:
    """Every ``slow_interval``: the job's mean iteration time from the counters and the
    regression ratio of its medians over minutes (a finer refresh would change nothing)."""
    sel = config.selectors.exporters
    rate = format_duration(config.rate_window)
    steps, seconds = (select("argus_steps_total", sel),
                      select("argus_step_seconds_total", sel))
    return _group("argus.l1.trend", config.slow_interval, [
        _record("job:argus_iteration_seconds:max_rate",
                f"max by (job) (rate({seconds}[{rate}]) / rate({steps}[{rate}]))"),
        _record("job:argus_iteration_seconds:recent_median",
                "quantile_over_time(0.5, job:argus_iteration_seconds:max_rate"
                f"[{format_duration(config.regression_recent)}])"),
        _record("job:argus_iteration_seconds:baseline_median",
                "quantile_over_time(0.5, job:argus_iteration_seconds:max_rate"
                f"[{format_duration(config.regression_baseline)}] offset "
                f"{format_duration(config.regression_recent)})"),
        _record("job:argus_iteration_regression:ratio",
                "job:argus_iteration_seconds:recent_median\n"
                "/ job:argus_iteration_seconds:baseline_median"),
    ])


def l2_group(config: RulesConfig, axis: str) -> dict:
    """Per ``axis`` group, every ``slow_interval`` (the phase medians cover the last 32 steps):
    the compute phases' median, robust spread and straggler threshold; per collective of the
    axis, each group's shortest time and its median, spread and threshold across groups.

    Cost: two passes over every rank's compute phases (median, then the spread around it) and
    small reads of the group series; the alert adds one pass."""
    sel = config.selectors.exporters
    phases = select("argus_phase_window_seconds", STAT_MEDIAN, compute_phases(), sel)
    comm = select("argus_phase_window_seconds", STAT_MEDIAN, axis_phases(axis), sel)
    group = group_labels(axis, "phase")
    on_axis = f'{{axis="{axis}"}}'
    rules = [
        _record("axis_group:argus_phase_seconds:median",
                f"quantile by ({group}) (0.5, {phases})", axis=axis),
        *_spread_and_threshold("axis_group:argus_phase_seconds", group, phases, on_axis, axis,
                               config),
        _record("axis_group:argus_collective_seconds:min",
                f"min by ({group}) ({comm})", axis=axis),
        _record("job_phase:argus_collective_group_min_seconds:median",
                f"quantile by (job, phase) (0.5, axis_group:argus_collective_seconds:min"
                f"{on_axis})", axis=axis),
        *_spread_and_threshold("job_phase:argus_collective_group_min_seconds", "job, phase",
                               f"axis_group:argus_collective_seconds:min{on_axis}", on_axis,
                               axis, config),
    ]
    return _group(f"argus.l2.{axis}", config.slow_interval, rules)


def _spread_and_threshold(prefix: str, by: str, values: str, on_axis: str, axis: str,
                          config: RulesConfig) -> list[dict]:
    """``scale = max(1.4826 MAD, floor x median)`` (the core's robust spread, never below 2%
    of the median) and ``threshold = median + max((min_ratio - 1) x median, z x scale)``: a
    value above the threshold passes both of the core's tests, ratio and robust z."""
    median = f"{prefix}:median{on_axis}"
    scale = f"{prefix}:scale{on_axis}"
    mad = (f"quantile by ({by}) (0.5, abs(\n    {values}\n    - on ({by}) group_left\n"
           f"    {median}\n  ))")
    spread = _max(by, ("mad", f"{MAD_TO_SIGMA} * {mad}"),
                  ("floor", f"{config.l2_scale_floor} * {median}"))
    margin = _max(by, ("ratio", f"{config.l2_min_ratio - 1:g} * {median}"),
                  ("z", f"{config.l2_z} * {scale}"))
    return [_record(f"{prefix}:scale", spread, axis=axis),
            _record(f"{prefix}:threshold", f"{median}\n+ on ({by})\n{margin}", axis=axis)]


def pipeline_group(config: RulesConfig) -> dict:
    """Exporter drops and queues, processor intake and uploads, scorer freshness."""
    sel = config.selectors
    window = format_duration(max(config.rate_window, 4 * config.scrape_interval))
    return _group("argus.pipeline", config.slow_interval, [
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
