"""Every metric, recording-rule and alert name the dashboards use, and every PromQL query.

One table, so that a renamed rule or metric is changed here and nowhere else, and so that the
query checker (:mod:`argus_grafana.check`) knows which component must be running for a query to
return data. Queries are plain PromQL strings with Grafana's variables left in (``$job``,
``$rank``, ``$axis``, ``$kernel``, ``$__rate_interval``, ``$__range``); the checker substitutes
them the way Grafana does.

Where the names come from:

- ``exporter``: the per-rank ``/metrics`` of ``argus_exporters`` (labels job, rank, host, dp, tp,
  pp, ep), scraped with ``honor_labels: true`` so the training job's ``job`` label survives.
- ``processor``: ``argus processor``'s ``/metrics``. Its health series carry no ``job`` label of
  their own, so they get the scrape job's (``argus-processor``); its kernel summaries keep the
  training job's.
- ``rules`` and ``alerts``: ``recording_rules/`` and ``alerting/``.
- ``scorer``: ``argus score``.
- ``prometheus``: series Prometheus writes itself (``up``, ``scrape_*``, ``process_*`` of a
  target).
"""

from __future__ import annotations

import re

from argus_core.detect.l3 import L3Config
from argus_core.rules.config import RulesConfig, format_duration
from argus_core.rules.recording import GROUP_STATISTICS, group_statistic
from argus_exporters.config import Settings

EXPORTER, PROCESSOR, RULES, SCORER, ALERTS, PROMETHEUS = (
    "exporter", "processor", "rules", "scorer", "alerts", "prometheus")

# -- scrape jobs (the local stack's Prometheus and docs/dashboards.md's scrape config use these) --
EXPORTERS_SCRAPE_JOB = "argus-exporters"
PROCESSOR_SCRAPE_JOB = "argus-processor"
SCORER_SCRAPE_JOB = "argus-scorer"
ARGUS_SCRAPE_JOBS = f"{EXPORTERS_SCRAPE_JOB}|{PROCESSOR_SCRAPE_JOB}|{SCORER_SCRAPE_JOB}"

# -- thresholds shown on panels: the rules' (RulesConfig reads them from the core's L1Config /
# L2Config), the core's L3Config and the exporters' defaults; one config, nothing restated here --
_RULES = RulesConfig()
SPIKE_RATIO = _RULES.spike_ratio
MIN_REGRESSION = _RULES.min_regression
REGRESSION_RECENT = format_duration(_RULES.regression_recent)  # window of the recent median
REGRESSION_BASELINE = format_duration(_RULES.regression_baseline)  # best pace looked back on
L2_MIN_RATIO = _RULES.l2_min_ratio  # a rank flagged at L2 is at least this much slower ...
L2_Z = _RULES.l2_z  # ... and at least this many robust spreads away (more in large jobs)
L3_MIN_SCORE = L3Config().min_score  # an L3 flag needs at least this much extra kernel time
EXPORTER_CPU_BUDGET = 0.02  # the exporters' promise: < 2% of step time
EXPORTER_QUEUE_RECORDS = Settings().queue_records  # ARGUS_QUEUE_RECORDS: drops start here

# -- names, by the component that produces them --
METRICS: dict[str, str] = {
    # exporters (per rank)
    "argus_steps_total": EXPORTER,
    "argus_step_seconds_total": EXPORTER,
    "argus_step_gpu_seconds_total": EXPORTER,
    "argus_phase_seconds_total": EXPORTER,
    "argus_step_window_seconds": EXPORTER,
    "argus_phase_window_seconds": EXPORTER,
    "argus_exporter_queue_depth": EXPORTER,
    "argus_exporter_shipped_bytes_total": EXPORTER,
    "argus_exporter_shipped_records_total": EXPORTER,
    "argus_exporter_export_failures_total": EXPORTER,
    "argus_exporter_cpu_seconds_total": EXPORTER,
    "argus_exporter_dropped_records_total": EXPORTER,
    "argus_exporter_probe_up": EXPORTER,
    "argus_phase_order_info": EXPORTER,
    # processor (per host)
    "argus_kernel_duration_seconds": PROCESSOR,
    "argus_kernel_executions": PROCESSOR,
    "argus_rank_info": PROCESSOR,
    "argus_processor_records_total": PROCESSOR,
    "argus_processor_kernel_events_total": PROCESSOR,
    "argus_processor_received_bytes_total": PROCESSOR,
    "argus_processor_rejected_records_total": PROCESSOR,
    "argus_processor_windows_written_total": PROCESSOR,
    "argus_processor_upload_failures_total": PROCESSOR,
    "argus_processor_dropped_files_total": PROCESSOR,
    "argus_processor_spool_bytes": PROCESSOR,
    "argus_processor_buffered_kernel_events": PROCESSOR,
    "argus_processor_open_windows": PROCESSOR,
    # recording rules (recording_rules/argus.rules.yml)
    "job:argus_iteration_seconds:recent_median": RULES,
    "job:argus_iteration_seconds:baseline_median": RULES,
    "job:argus_iteration_regression:ratio": RULES,
    "job:argus_iteration_regression:threshold": RULES,
    "axis_group:argus_phase_seconds:median": RULES,
    "axis_group:argus_phase_seconds:threshold": RULES,
    # ... or, with l2_source: scorer, the scorer's own (the fallback of GROUP_MEDIAN and
    # GROUP_THRESHOLD, so they need the rules' source only: see FALLBACKS)
    "argus_l2_group_median_seconds": SCORER,
    "argus_l2_group_threshold_seconds": SCORER,
    "job_phase:argus_phase_log_ratio:scale": RULES,
    "job:argus_l2_z:family": RULES,
    # alert rules (alerting/argus.alerts.yml): Prometheus's ALERTS series
    "ALERTS": ALERTS,
    # the W1 scoring job (argus score)
    "argus_kernel_w1_score": SCORER,
    "argus_kernel_straggler": SCORER,
    "argus_verdict": SCORER,
    "argus_phase_straggler_ratio": SCORER,
    "argus_rank_wait_seconds": SCORER,
    "argus_scorer_l2_tests": SCORER,
    "argus_scorer_last_success_timestamp_seconds": SCORER,
    "argus_scorer_round_duration_seconds": SCORER,
    "argus_scorer_query_failures_total": SCORER,
    # written by Prometheus for every target
    "up": PROMETHEUS,
    "scrape_duration_seconds": PROMETHEUS,
    "process_resident_memory_bytes": PROMETHEUS,
}

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The names of :data:`METRICS` that a PromQL expression reads."""
    return {token for token in _NAME.findall(_strip_strings(expr)) if token in METRICS}


FALLBACKS = {published: recorded for recorded, published in GROUP_STATISTICS.values()}
"""Scorer series a query reads only where the recorded series before it in an ``or`` is
missing: the query needs the recorded series' source (a Prometheus with either answers)."""


def sources(expr: str) -> set[str]:
    """The components a query needs (exporter, processor, rules, scorer, alerts, prometheus)."""
    names = metric_names(expr)
    return {METRICS[name] for name in names if FALLBACKS.get(name) not in names}


def _strip_strings(expr: str) -> str:
    """The expression without its quoted strings (label values are not metric names)."""
    return re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`', '""', expr)


# -- selectors --
JOBS = 'job=~"$job"'  # multi-value job variable (overview, pipeline)
JOB = 'job="$job"'  # single job (stragglers, kernels)
RATE = "$__rate_interval"
# What identifies a rank's phase series once every other label (host, instance, and whatever
# target labels a deployment adds: pod, namespace, cluster) is dropped. A rank's group on axis X
# is then every one of these labels but rank and X: matching on what remains, rather than
# ignoring a fixed list, keeps the L2 panels working whatever labels the scrape adds.
RANK_KEY = "job, rank, phase, dp, tp, pp, ep"


def _per_rank_step(numerator: str, selector: str, window: str = RATE) -> str:
    """Per rank, a counter's increase per completed step over ``window`` (seconds per step)."""
    return (f"rate({numerator}{{{selector}}}[{window}])"
            f" / rate(argus_steps_total{{{selector}}}[{window}])")


# -- L1: Fail-slow overview --
ITERATION_SECONDS = f"max by (job) ({_per_rank_step('argus_step_seconds_total', JOBS)})"
"""The job's iteration time: the slowest rank's mean step time (synchronous training runs at
the speed of its slowest rank), over Grafana's rate interval."""

_ITERATION_5M = f"max by (job) ({_per_rank_step('argus_step_seconds_total', JOBS, '5m')})"
BEST_ITERATION_SECONDS = f"min_over_time(({_ITERATION_5M})[$__range:1m])"
"""The job's healthy pace: its best 5-minute iteration time over the range shown."""

SLOWEST_RECENT_STEP = f'max by (job) (argus_step_window_seconds{{{JOBS}, stat="max"}})'
MEDIAN_RECENT_STEP = f'max by (job) (argus_step_window_seconds{{{JOBS}, stat="median"}})'
SPIKE_RATIO_NOW = f"{SLOWEST_RECENT_STEP} / {MEDIAN_RECENT_STEP}"
"""Slowest of the last N steps (ARGUS_WINDOW_STEPS) over their median, from the exporters'
rolling-window gauges: a one-step spike stays visible between two scrapes."""
SPIKE_MARKERS = f"({SPIKE_RATIO_NOW}) >= {SPIKE_RATIO}"

BASELINE_SECONDS = f"job:argus_iteration_seconds:baseline_median{{{JOBS}}}"
REGRESSION_RATIO = f"job:argus_iteration_regression:ratio{{{JOBS}}}"
REGRESSION_THRESHOLD = f"job:argus_iteration_regression:threshold{{{JOBS}}}"
"""The ratio a regression must reach: min_regression, or wider for a job whose pace wanders."""
REGRESSION_MARKERS = f"{REGRESSION_RATIO} >= on (job) {REGRESSION_THRESHOLD}"

STEPS_PER_MINUTE = f"60 * min by (job) (rate(argus_steps_total{{{JOBS}}}[{RATE}]))"
RANKS = f"count by (job) (argus_steps_total{{{JOBS}}})"

GPUS_LOST = (f"{RANKS} * clamp_min(1 - {BEST_ITERATION_SECONDS} / {ITERATION_SECONDS}, 0)")
"""GPUs' worth of time lost right now: ranks x the share of each step spent above the job's
healthy pace (an idle-equivalent GPU count; integrated over time it is GPU-hours)."""

GPU_HOURS_LOST = (
    f"{RANKS} * clamp_min("
    f"max by (job) (increase(argus_step_seconds_total{{{JOBS}}}[$__range]))"
    f" - max by (job) (increase(argus_steps_total{{{JOBS}}}[$__range]))"
    f" * {BEST_ITERATION_SECONDS}, 0) / 3600")
"""GPU-hours lost to fail-slow over the range: (elapsed time - steps x healthy iteration time)
x ranks. The number a manager asks for."""

ARGUS_ALERTS = f'ALERTS{{alertname=~"Argus.*", alertstate="firing", {JOBS}}}'
SPIKE_ALERTS = f'ALERTS{{alertname="ArgusIterationSpike", alertstate="firing", {JOBS}}}'
REGRESSION_ALERTS = f'ALERTS{{alertname="ArgusIterationRegression", alertstate="firing", {JOBS}}}'
FIRING_ALERTS = (f'count by (alertname, job, rank, severity, level) ({ARGUS_ALERTS})')

# -- L2: Stragglers --
PHASE_SECONDS = (f'max by ({RANK_KEY}) (argus_phase_window_seconds{{{JOB}, stat="median"}})')
"""Each rank's phase time per step: the median of its last N steps (exporter gauge)."""
RANK_PHASE_SECONDS = (f'max by ({RANK_KEY}) (argus_phase_window_seconds{{{JOB},'
                      f' stat="median", rank="$rank"}})')

GROUP_MEDIAN = group_statistic("median", f'{JOB}, axis="$axis"')
"""Per $axis group and compute phase, the group's median: recorded by the L2 rules
(``l2_source: promql``) or the scorer's own series (``scorer``, not re-recorded)."""
GROUP_THRESHOLD = group_statistic("threshold", f'{JOB}, axis="$axis"')
"""Per group and compute phase, the time above which L2 flags a rank (the group median
x max(min ratio, exp(z x scale)), the z family-wise over the whole job), from the same place."""
LOG_RATIO_SCALE = f'job_phase:argus_phase_log_ratio:scale{{{JOB}, axis="$axis"}}'
"""Per compute phase, the robust spread of ln(time / group median) pooled over the $axis
groups (never below the core's scale floor)."""
FAMILY_Z = f"job:argus_l2_z:family{{{JOB}}}"
"""The z the L2 rules require in this job: Phi^-1(1 - alpha / N), N = every statistic judged,
never below the core's z threshold."""
# A rank's own series against its group's recorded statistic: the group is the rank's key but
# the rank and the compared axis (and the rule's own axis label, on the right).
_TO_GROUP = "ignoring (rank, axis, $axis) group_left"

PHASE_RATIO = f"{PHASE_SECONDS} / {_TO_GROUP} {GROUP_MEDIAN}"
"""Each rank's compute-phase time over its $axis group's median (the scorer's or the L2
rules'; communication phases have no median there: waiting is not slowness)."""
PHASE_ROBUST_Z = (f"ln({PHASE_SECONDS} / {_TO_GROUP} {GROUP_MEDIAN})"
                  f" / on (job, phase) group_left {LOG_RATIO_SCALE}")
"""Each rank's robust z in the core's units: ln(time / group median) over the pooled spread."""
RANK_PHASE_RATIO_MATRIX = f"max by (rank, phase) ({PHASE_RATIO})"
WORST_PHASE_RATIO_BY_RANK = f"max by (rank) ({PHASE_RATIO})"
WORST_RANKS = f"topk(10, {RANK_PHASE_RATIO_MATRIX})"
WORST_RANKS_Z = f"max by (rank, phase) ({PHASE_ROBUST_Z})"
VERDICTS = f"max by (rank, cause) (argus_verdict{{{JOB}}})"
RANK_GROUP_MEDIAN = f"{GROUP_MEDIAN} and ignoring (rank, axis, $axis) {RANK_PHASE_SECONDS}"
"""The median of the selected rank's $axis group, per phase (to draw beside the rank's own)."""
RANK_GROUP_THRESHOLD = (f"{GROUP_THRESHOLD} and ignoring (rank, axis, $axis)"
                        f" {RANK_PHASE_SECONDS}")
"""Where L2 would flag the selected rank, per phase."""
SCORER_PHASE_FINDINGS = (f"max by (rank, phase, axis, kind)"
                         f" (argus_phase_straggler_ratio{{{JOB}}})")
"""Every L2 finding of the core, from the scorer: ranks against their group on every axis,
pipeline stages compared where they do alike work, pairs decided by who waits, collectives
judged on transfer time (waiting removed)."""

HOST_SECONDS_PER_STEP = (
    f"(rate(argus_step_seconds_total{{{JOB}}}[{RATE}])"
    f" - rate(argus_step_gpu_seconds_total{{{JOB}}}[{RATE}]))"
    f" / rate(argus_steps_total{{{JOB}}}[{RATE}])")
"""Host time per step (wall - GPU) by rank: a rank stalled on the host (JIT, GC, data loader)
stands out while its GPU time does not."""

RANK_WAIT_SECONDS = f"max by (rank) (argus_rank_wait_seconds{{{JOB}}})"
"""Per rank, the time per step it waits in collectives for late peers, measured by the scorer
from arrival skew (when each rank entered the collective against the last arriver): the
ranks that wait are victims; the one that never waits arrives last."""

# -- L3: Kernels --
_KERNEL = f'{JOB}, rank=~"$rank", kernel="$kernel"'
KERNEL_P50 = f'argus_kernel_duration_seconds{{{_KERNEL}, quantile="0.5"}}'
KERNEL_P99 = f'argus_kernel_duration_seconds{{{_KERNEL}, quantile="0.99"}}'
KERNEL_P50_BY_RANK = (f'max by (rank) (argus_kernel_duration_seconds{{{JOB}, kernel="$kernel",'
                      f' quantile="0.5"}})')
KERNEL_EXECUTIONS_BY_CLUSTER = f"sum by (cluster) (argus_kernel_executions{{{_KERNEL}}})"
CLUSTERS_PER_KERNEL = (f"max by (kernel, stream) (count by (kernel, stream, rank)"
                       f" (argus_kernel_executions{{{JOB}}}))")
RANK_INFO = f'argus_rank_info{{{JOB}, rank=~"$rank"}}'
W1_SCORE_BY_RANK = f'max by (rank) (argus_kernel_w1_score{{{JOB}, rank=~"$rank"}})'
DEGRADED_KERNELS = (f"argus_kernel_w1_score{{{JOB}}} and on (job, rank, kernel, stream)"
                    f" (argus_kernel_straggler{{{JOB}}} == 1)")

# -- Pipeline health --
EXPORTER_DROPS = (f"sum by (job, reason) (rate(argus_exporter_dropped_records_total{{{JOBS}}}"
                  f"[{RATE}]))")
EXPORTER_QUEUE_DEPTH = f"max by (job) (argus_exporter_queue_depth{{{JOBS}}})"
EXPORTER_CPU_SHARE = (f"sum by (job) (rate(argus_exporter_cpu_seconds_total{{{JOBS}}}[{RATE}]))"
                      f" / sum by (job) (rate(argus_step_seconds_total{{{JOBS}}}[{RATE}]))")
EXPORTER_SHIPPED_BYTES = (f"sum by (job) (rate(argus_exporter_shipped_bytes_total{{{JOBS}}}"
                          f"[{RATE}]))")
EXPORTER_EXPORT_FAILURES = (f"sum by (job) (rate(argus_exporter_export_failures_total{{{JOBS}}}"
                            f"[{RATE}]))")
PROBE_STATES = f"count by (job, probe, state, reason) (argus_exporter_probe_up{{{JOBS}}})"
PROCESSOR_KERNEL_EVENTS = f"sum by (instance) (rate(argus_processor_kernel_events_total[{RATE}]))"
PROCESSOR_RECORDS = f"sum by (instance) (rate(argus_processor_records_total[{RATE}]))"
PROCESSOR_REJECTED = (f"sum by (instance, reason)"
                      f" (rate(argus_processor_rejected_records_total[{RATE}]))")
PROCESSOR_UPLOAD_FAILURES = (f"sum by (instance)"
                             f" (rate(argus_processor_upload_failures_total[{RATE}]))")
PROCESSOR_DROPPED_FILES = "sum(increase(argus_processor_dropped_files_total[$__range]))"
PROCESSOR_SPOOL_BYTES = "max by (instance) (argus_processor_spool_bytes)"
PROCESSOR_HELD_EVENTS = "max by (instance) (argus_processor_buffered_kernel_events)"
PROCESSOR_RSS = f'max by (instance) (process_resident_memory_bytes{{job="{PROCESSOR_SCRAPE_JOB}"}})'
SCORER_AGE = "time() - max by (instance) (argus_scorer_last_success_timestamp_seconds)"
SCORER_ROUND_SECONDS = "max by (instance) (argus_scorer_round_duration_seconds)"
SCORER_QUERY_FAILURES = (f"sum by (instance) (rate(argus_scorer_query_failures_total[{RATE}]))")
TARGETS_UP = f'avg by (job) (up{{job=~"{ARGUS_SCRAPE_JOBS}"}})'
SCRAPE_SECONDS = f'max by (job) (scrape_duration_seconds{{job=~"{ARGUS_SCRAPE_JOBS}"}})'

# -- variables --
VAR_JOB = "label_values(argus_steps_total, job)"
VAR_RANK = f"label_values(argus_steps_total{{{JOB}}}, rank)"
VAR_KERNEL_RANK = f"label_values(argus_kernel_executions{{{JOB}}}, rank)"
VAR_KERNEL = f"label_values(argus_kernel_executions{{{JOB}}}, kernel)"
AXES = _RULES.axes  # the axes whose groups the L2 rules record (pp is the scorer's)
