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
- ``act``: ``argus act``, the remediation planner ArgusSuspectUnit is routed to.
- ``prometheus``: series Prometheus writes itself (``up``, ``scrape_*``, ``process_*`` of a
  target).

Everything a ``RulesConfig`` decides (thresholds and windows the panels show, the axes, the
component selectors, the scrape jobs, the scorer's staleness) is in :class:`Queries`, built by
:func:`queries_for` for one config, so ``argus generate --config`` writes rules and dashboards
that agree. The module's own attributes (``queries.SPIKE_MARKERS``) are the defaults'.
"""

from __future__ import annotations

import functools
import re
from types import SimpleNamespace

from argus_core.detect.l3 import L3Config
from argus_core.rules.config import RulesConfig, Selectors, format_duration
from argus_core.rules.recording import GROUP_STATISTICS, group_statistic
from argus_exporters.config import Settings

EXPORTER, PROCESSOR, RULES, SCORER, ALERTS, PROMETHEUS, ACT = (
    "exporter", "processor", "rules", "scorer", "alerts", "prometheus", "act")

# -- thresholds that are no rules setting: the core's L3Config and the exporters' defaults --
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
    "argus_phase_clock_info": EXPORTER,
    # processor (per host)
    "argus_kernel_duration_seconds": PROCESSOR,
    "argus_kernel_executions": PROCESSOR,
    "argus_rank_info": PROCESSOR,
    "argus_rank_placement_info": PROCESSOR,
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
    "argus_suspect": SCORER,
    "argus_suspect_info": SCORER,
    "argus_suspect_cost_seconds": SCORER,
    # the remediation planner (argus act)
    "argus_act_plan": ACT,
    "argus_act_decisions_total": ACT,
    "argus_act_execute": ACT,
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


class Queries(SimpleNamespace):
    """Every dashboard query, and the settings the panels show, for one ``RulesConfig``
    (upper-case attributes: constants of that config)."""


def queries_for(config: RulesConfig | None = None) -> Queries:
    """The dashboards' queries for ``config`` (default: the defaults): its thresholds and
    windows, its axes and scrape jobs, and its component selectors on every series a
    component produces (:func:`scoped`)."""
    config = config or RulesConfig()
    q = Queries()
    # -- settings shown on panels: the rules' (RulesConfig reads its thresholds from the
    # core's L1Config / L2Config); nothing restated here --
    q.SPIKE_RATIO = config.spike_ratio
    q.MIN_REGRESSION = config.min_regression
    q.REGRESSION_RECENT = format_duration(config.regression_recent)  # the recent median's window
    q.REGRESSION_BASELINE = format_duration(config.regression_baseline)  # best pace looked back on
    q.L2_MIN_RATIO = config.l2_min_ratio  # a rank flagged at L2 is at least this much slower ...
    q.L2_Z = config.l2_z  # ... and at least this many robust spreads away (more in large jobs)
    q.AXES = config.axes  # the axes whose groups the rules record (pp is the scorer's)
    q.SCORER_STALE_S = config.scorer_stale_after
    q.L3_MIN_SCORE = L3_MIN_SCORE
    q.EXPORTER_CPU_BUDGET = EXPORTER_CPU_BUDGET
    q.EXPORTER_QUEUE_RECORDS = EXPORTER_QUEUE_RECORDS
    up = config.selectors
    q.ARGUS_TARGETS = (f"up{{{up.exporters_up}}} or up{{{up.processor_up}}}"
                       f" or up{{{up.scorer_up}}}")

    # -- L1: Fail-slow overview --
    # The job's iteration time: the slowest rank's mean step time (synchronous training runs at
    # the speed of its slowest rank), over Grafana's rate interval.
    q.ITERATION_SECONDS = f"max by (job) ({_per_rank_step('argus_step_seconds_total', JOBS)})"

    q._ITERATION_5M = f"max by (job) ({_per_rank_step('argus_step_seconds_total', JOBS, '5m')})"
    # The job's healthy pace: its best 5-minute iteration time over the range shown.
    q.BEST_ITERATION_SECONDS = f"min_over_time(({q._ITERATION_5M})[$__range:1m])"

    q.SLOWEST_RECENT_STEP = f'max by (job) (argus_step_window_seconds{{{JOBS}, stat="max"}})'
    q.MEDIAN_RECENT_STEP = f'max by (job) (argus_step_window_seconds{{{JOBS}, stat="median"}})'
    # Slowest of the last N steps (ARGUS_WINDOW_STEPS) over their median, from the exporters'
    # rolling-window gauges: a one-step spike stays visible between two scrapes.
    q.SPIKE_RATIO_NOW = f"{q.SLOWEST_RECENT_STEP} / {q.MEDIAN_RECENT_STEP}"
    q.SPIKE_MARKERS = f"({q.SPIKE_RATIO_NOW}) >= {q.SPIKE_RATIO}"

    q.BASELINE_SECONDS = f"job:argus_iteration_seconds:baseline_median{{{JOBS}}}"
    q.REGRESSION_RATIO = f"job:argus_iteration_regression:ratio{{{JOBS}}}"
    # The ratio a regression must reach: min_regression, or wider for a job whose pace wanders.
    q.REGRESSION_THRESHOLD = f"job:argus_iteration_regression:threshold{{{JOBS}}}"
    q.REGRESSION_MARKERS = f"{q.REGRESSION_RATIO} >= on (job) {q.REGRESSION_THRESHOLD}"

    q.STEPS_PER_MINUTE = f"60 * min by (job) (rate(argus_steps_total{{{JOBS}}}[{RATE}]))"
    q.RANKS = f"count by (job) (argus_steps_total{{{JOBS}}})"

    # GPUs' worth of time lost right now: ranks x the share of each step spent above the job's
    # healthy pace (an idle-equivalent GPU count; integrated over time it is GPU-hours).
    q.GPUS_LOST = (f"{q.RANKS} * clamp_min(1 - {q.BEST_ITERATION_SECONDS}"
                   f" / {q.ITERATION_SECONDS}, 0)")

    # GPU-hours lost to fail-slow over the range: (elapsed time - steps x healthy iteration time)
    # x ranks. The number a manager asks for.
    q.GPU_HOURS_LOST = (
        f"{q.RANKS} * clamp_min("
        f"max by (job) (increase(argus_step_seconds_total{{{JOBS}}}[$__range]))"
        f" - max by (job) (increase(argus_steps_total{{{JOBS}}}[$__range]))"
        f" * {q.BEST_ITERATION_SECONDS}, 0) / 3600")

    q.ARGUS_ALERTS = f'ALERTS{{alertname=~"Argus.*", alertstate="firing", {JOBS}}}'
    q.SPIKE_ALERTS = f'ALERTS{{alertname="ArgusIterationSpike", alertstate="firing", {JOBS}}}'
    q.REGRESSION_ALERTS = (f'ALERTS{{alertname="ArgusIterationRegression", alertstate="firing",'
                           f' {JOBS}}}')
    q.FIRING_ALERTS = (f'count by (alertname, job, rank, severity, level) ({q.ARGUS_ALERTS})')

    # -- L2: Stragglers --
    # Each rank's phase time per step: the median of its last N steps (exporter gauge).
    q.PHASE_SECONDS = (f'max by ({RANK_KEY}) (argus_phase_window_seconds{{{JOB}, stat="median"}})')
    q.RANK_PHASE_SECONDS = (f'max by ({RANK_KEY}) (argus_phase_window_seconds{{{JOB},'
                          f' stat="median", rank="$rank"}})')

    # Per $axis group and compute phase, the group's median: recorded by the L2 rules
    # (``l2_source: promql``) or the scorer's own series (``scorer``, not re-recorded).
    q.GROUP_MEDIAN = group_statistic("median", f'{JOB}, axis="$axis"')
    # Per group and compute phase, the time above which L2 flags a rank (the group median
    # x max(min ratio, exp(z x scale)), the z family-wise over the whole job), from the same place.
    q.GROUP_THRESHOLD = group_statistic("threshold", f'{JOB}, axis="$axis"')
    # Per compute phase, the robust spread of ln(time / group median) pooled over the $axis
    # groups (never below the core's scale floor).
    q.LOG_RATIO_SCALE = f'job_phase:argus_phase_log_ratio:scale{{{JOB}, axis="$axis"}}'
    # The z the L2 rules require in this job: Phi^-1(1 - alpha / N), N = every statistic judged,
    # never below the core's z threshold.
    q.FAMILY_Z = f"job:argus_l2_z:family{{{JOB}}}"
    # A rank's own series against its group's recorded statistic: the group is the rank's key but
    # the rank and the compared axis (and the rule's own axis label, on the right).
    q._TO_GROUP = "ignoring (rank, axis, $axis) group_left"

    # Each rank's compute-phase time over its $axis group's median (the scorer's or the L2
    # rules'; communication phases have no median there: waiting is not slowness).
    q.PHASE_RATIO = f"{q.PHASE_SECONDS} / {q._TO_GROUP} {q.GROUP_MEDIAN}"
    # Each rank's robust z in the core's units: ln(time / group median) over the pooled spread.
    q.PHASE_ROBUST_Z = (f"ln({q.PHASE_SECONDS} / {q._TO_GROUP} {q.GROUP_MEDIAN})"
                      f" / on (job, phase) group_left {q.LOG_RATIO_SCALE}")
    q.RANK_PHASE_RATIO_MATRIX = f"max by (rank, phase) ({q.PHASE_RATIO})"
    q.WORST_PHASE_RATIO_BY_RANK = f"max by (rank) ({q.PHASE_RATIO})"
    q.WORST_RANKS = f"topk(10, {q.RANK_PHASE_RATIO_MATRIX})"
    q.WORST_RANKS_Z = f"max by (rank, phase) ({q.PHASE_ROBUST_Z})"
    q.VERDICTS = f"max by (rank, cause) (argus_verdict{{{JOB}}})"
    # The median of the selected rank's $axis group, per phase (to draw beside the rank's own).
    q.RANK_GROUP_MEDIAN = (f"{q.GROUP_MEDIAN} and ignoring (rank, axis, $axis)"
                           f" {q.RANK_PHASE_SECONDS}")
    # Where L2 would flag the selected rank, per phase.
    q.RANK_GROUP_THRESHOLD = (f"{q.GROUP_THRESHOLD} and ignoring (rank, axis, $axis)"
                            f" {q.RANK_PHASE_SECONDS}")
    # Every L2 finding of the core, from the scorer: ranks against their group on every axis,
    # pipeline stages compared where they do alike work, pairs decided by who waits, collectives
    # judged on transfer time (waiting removed).
    q.SCORER_PHASE_FINDINGS = (f"max by (rank, phase, axis, kind)"
                             f" (argus_phase_straggler_ratio{{{JOB}}})")

    # Host time per step (wall - GPU) by rank: a rank stalled on the host (JIT, GC, data loader)
    # stands out while its GPU time does not.
    q.HOST_SECONDS_PER_STEP = (
        f"(rate(argus_step_seconds_total{{{JOB}}}[{RATE}])"
        f" - rate(argus_step_gpu_seconds_total{{{JOB}}}[{RATE}]))"
        f" / rate(argus_steps_total{{{JOB}}}[{RATE}])")

    # Per rank, the time per step it waits in collectives for late peers, measured by the scorer
    # from arrival skew (when each rank entered the collective against the last arriver): the
    # ranks that wait are victims; the one that never waits arrives last.
    q.RANK_WAIT_SECONDS = f"max by (rank) (argus_rank_wait_seconds{{{JOB}}})"

    # Where each rank runs, one series per rank (host and leaf switch from its placement).
    q._PLACEMENT = (f"max by (job, rank, host, leaf) (argus_rank_placement_info{{{JOB}}})")
    # The worst compute-phase ratio of the ranks on each host, with the host's leaf switch: a
    # slow host, or every host of one leaf slow, shows as a block of rows.
    q.WORST_RATIO_BY_HOST = (f"max by (leaf, host) (max by (job, rank) ({q.PHASE_RATIO})"
                             f" * on (job, rank) group_left (host, leaf) {q._PLACEMENT})")
    # Verdicts per host and leaf switch, by cause.
    q.VERDICTS_BY_HOST = (f"count by (leaf, host, cause) (argus_verdict{{{JOB}}}"
                          f" * on (job, rank) group_left (host, leaf) {q._PLACEMENT})")

    # -- Suspects: the hardware units that explain the verdicts, and the plan --
    q.SUSPECT_RANKS = f"argus_suspect{{{JOBS}}}"
    q.SUSPECT_INFO = f"argus_suspect_info{{{JOBS}}}"
    q.SUSPECT_COST = f"argus_suspect_cost_seconds{{{JOBS}}}"
    # What a suspect costs, as a share of the job's step and in GPUs idle-equivalent now (its
    # cost a step over the iteration time, x the job's ranks).
    q.SUSPECT_COST_SHARE = (f"{q.SUSPECT_COST} / on (job) group_left"
                            f" {q.ITERATION_SECONDS}")
    q.SUSPECT_GPUS_LOST = f"{q.SUSPECT_COST_SHARE} * on (job) group_left {q.RANKS}"
    # GPU-hours lost to each suspect over the range: its idle-equivalent GPUs every 15 s (240
    # samples an hour).
    q.SUSPECT_GPU_HOURS = f"sum_over_time(({q.SUSPECT_GPUS_LOST})[$__range:15s]) / 240"
    q.SUSPECT_ALERTS = (f'ALERTS{{alertname="ArgusSuspectUnit", alertstate="firing",'
                        f' {JOBS}}}')
    q.ACT_PLAN = f"argus_act_plan{{{JOBS}}}"
    q.ACT_DECISIONS = "sum by (state) (increase(argus_act_decisions_total[$__range]))"
    q.ACT_EXECUTE = "max(argus_act_execute)"

    # -- L3: Kernels --
    q._KERNEL = f'{JOB}, rank=~"$rank", kernel="$kernel"'
    q.KERNEL_P50 = f'argus_kernel_duration_seconds{{{q._KERNEL}, quantile="0.5"}}'
    q.KERNEL_P99 = f'argus_kernel_duration_seconds{{{q._KERNEL}, quantile="0.99"}}'
    q.KERNEL_P50_BY_RANK = (f'max by (rank) (argus_kernel_duration_seconds{{{JOB},'
                            f' kernel="$kernel",'
                          f' quantile="0.5"}})')
    q.KERNEL_EXECUTIONS_BY_CLUSTER = f"sum by (cluster) (argus_kernel_executions{{{q._KERNEL}}})"
    q.CLUSTERS_PER_KERNEL = (f"max by (kernel, stream) (count by (kernel, stream, rank)"
                           f" (argus_kernel_executions{{{JOB}}}))")
    q.RANK_INFO = f'argus_rank_info{{{JOB}, rank=~"$rank"}}'
    q.W1_SCORE_BY_RANK = f'max by (rank) (argus_kernel_w1_score{{{JOB}, rank=~"$rank"}})'
    q.DEGRADED_KERNELS = (f"argus_kernel_w1_score{{{JOB}}} and on (job, rank, kernel, stream)"
                        f" (argus_kernel_straggler{{{JOB}}} == 1)")

    # -- Pipeline health --
    q.EXPORTER_DROPS = (f"sum by (job, reason) (rate(argus_exporter_dropped_records_total{{{JOBS}}}"
                      f"[{RATE}]))")
    q.EXPORTER_QUEUE_DEPTH = f"max by (job) (argus_exporter_queue_depth{{{JOBS}}})"
    q.EXPORTER_CPU_SHARE = (f"sum by (job) (rate(argus_exporter_cpu_seconds_total{{{JOBS}}}"
                            f"[{RATE}]))"
                          f" / sum by (job) (rate(argus_step_seconds_total{{{JOBS}}}[{RATE}]))")
    q.EXPORTER_SHIPPED_BYTES = (f"sum by (job) (rate(argus_exporter_shipped_bytes_total{{{JOBS}}}"
                              f"[{RATE}]))")
    q.EXPORTER_EXPORT_FAILURES = (f"sum by (job) (rate("
                                  f"argus_exporter_export_failures_total{{{JOBS}}}"
                                f"[{RATE}]))")
    q.PROBE_STATES = f"count by (job, probe, state, reason) (argus_exporter_probe_up{{{JOBS}}})"
    q.PROCESSOR_KERNEL_EVENTS = (f"sum by (instance)"
                                 f" (rate(argus_processor_kernel_events_total[{RATE}]))")
    q.PROCESSOR_RECORDS = f"sum by (instance) (rate(argus_processor_records_total[{RATE}]))"
    q.PROCESSOR_REJECTED = (f"sum by (instance, reason)"
                          f" (rate(argus_processor_rejected_records_total[{RATE}]))")
    q.PROCESSOR_UPLOAD_FAILURES = (f"sum by (instance)"
                                 f" (rate(argus_processor_upload_failures_total[{RATE}]))")
    q.PROCESSOR_DROPPED_FILES = "sum(increase(argus_processor_dropped_files_total[$__range]))"
    q.PROCESSOR_SPOOL_BYTES = "max by (instance) (argus_processor_spool_bytes)"
    q.PROCESSOR_HELD_EVENTS = "max by (instance) (argus_processor_buffered_kernel_events)"
    q.PROCESSOR_RSS = (f"max by (instance)"
                       f" (process_resident_memory_bytes{{{up.processor_up}}})")
    q.SCORER_AGE = "time() - max by (instance) (argus_scorer_last_success_timestamp_seconds)"
    q.SCORER_ROUND_SECONDS = "max by (instance) (argus_scorer_round_duration_seconds)"
    q.SCORER_QUERY_FAILURES = (f"sum by (instance)"
                               f" (rate(argus_scorer_query_failures_total[{RATE}]))")
    q.TARGETS_UP = f"avg by (job) ({q.ARGUS_TARGETS})"
    q.SCRAPE_SECONDS = (f"max by (job) (scrape_duration_seconds{{{up.exporters_up}}}"
                        f" or scrape_duration_seconds{{{up.processor_up}}}"
                        f" or scrape_duration_seconds{{{up.scorer_up}}})")

    # -- variables --
    q.VAR_JOB = "label_values(argus_steps_total, job)"
    q.VAR_RANK = f"label_values(argus_steps_total{{{JOB}}}, rank)"
    q.VAR_KERNEL_RANK = f"label_values(argus_kernel_executions{{{JOB}}}, rank)"
    q.VAR_KERNEL = f"label_values(argus_kernel_executions{{{JOB}}}, kernel)"
    for name, value in vars(q).items():
        if isinstance(value, str):
            setattr(q, name, scoped(value, config.selectors))
    return q


def scoped(expr: str, selectors: Selectors) -> str:
    """``expr`` with each component's extra matchers (``selectors.exporters``, ``processor``,
    ``scorer``) added to every series that component produces (recorded series, ALERTS and
    Prometheus's own carry none of them)."""
    extra = {EXPORTER: selectors.exporters, PROCESSOR: selectors.processor,
             SCORER: selectors.scorer}

    def add(match: re.Match) -> str:
        name, labels = match.group("name"), match.group("labels")
        matchers = extra.get(METRICS.get(name or ""), "")
        if not name or not matchers:
            return match.group(0)
        if labels is None:
            return f"{name}{{{matchers}}}"
        inner = labels[1:-1].strip()
        return f"{name}{{{inner + ', ' if inner else ''}{matchers}}}"

    return _SERIES.sub(add, expr)


_SERIES = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`'
                     r"|(?<![\w:])(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^{}]*\})?")


@functools.cache
def _defaults() -> Queries:
    return queries_for()


def __getattr__(name: str):
    """``queries.X``: the default config's query or setting ``X``."""
    try:
        return getattr(_defaults(), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
