"""Alerting rules: L1 (spike, regression, host stall), L2 (straggler rank, degraded link),
L3 (kernel straggler, from the scorer) and the pipeline's own health.

Every alert has ``severity``, ``level``, a static ``summary``, a ``description`` naming the job,
rank, phase or kernel and the ratio, and a ``runbook_url`` into the README's runbook. Per-rank
arithmetic happens here, after a comparison with a small recorded threshold has already
reduced each 10,000-rank vector to the ranks that stand out.
"""

from __future__ import annotations

from argus_core.rules.config import RulesConfig, format_duration
from argus_core.rules.promql import axis_phases, compute_phases, group_labels, select
from argus_core.rules.recording import STAT_MEDIAN

L1_SYMPTOMS = ("ArgusIterationSpike", "ArgusIterationRegression")
RANK_CAUSES = ("ArgusStragglerRank", "ArgusLinkDegraded", "ArgusKernelStraggler",
               "ArgusHostStall")
FAIL_SLOW = (*L1_SYMPTOMS, *RANK_CAUSES)


def alert_groups(config: RulesConfig) -> list[dict]:
    """Every alerting-rule group."""
    fast, slow = config.evaluation_interval, config.slow_interval
    return [{"name": name, "interval": format_duration(interval), "rules": rules}
            for name, interval, rules in (
                ("argus.alerts.l1", fast, l1_alerts(config)),
                ("argus.alerts.l2", slow, l2_alerts(config)),  # reads the L2 groups' records
                ("argus.alerts.l3", fast, l3_alerts(config)),
                ("argus.alerts.pipeline", fast, pipeline_alerts(config)),
            )]


def _alert(config: RulesConfig, name: str, expr: str, for_s: float, severity: str,
           level: str, summary: str, description: str) -> dict:
    return {"alert": name, "expr": expr, "for": format_duration(for_s),
            "labels": {"severity": severity, "level": level},
            "annotations": {"summary": summary, "description": description,
                            "runbook_url": f"{config.runbook_url}#{name.lower()}"}}


def l1_alerts(config: RulesConfig) -> list[dict]:
    """The job's iteration time: spikes, regressions, and the rank whose host stalled."""
    sel = config.selectors.exporters
    spike = config.spike_ratio
    host = format_duration(config.host_window)
    seconds = select("argus_step_seconds_total", sel)
    gpu = select("argus_step_gpu_seconds_total", sel)
    return [
        _alert(config, "ArgusIterationSpike",
               f"job:argus_iteration_spike:settled_ratio >= {spike}",
               config.for_spike, "warning", "L1",
               "A training job had an iteration-time spike.",
               "Job {{ $labels.job }}: its slowest step of the last "
               f"{config.exporter_window_steps} took "
               '{{ $value | printf "%.1f" }}x the rolling median step time, and the job is '
               "back to its usual pace."),
        _alert(config, "ArgusIterationRegression",
               f"job:argus_iteration_regression:ratio >= {config.min_regression}",
               config.for_regression, "critical", "L1",
               "A training job's iteration time regressed.",
               "Job {{ $labels.job }} runs "
               '{{ $value | printf "%.2f" }}x slower: median iteration time over the last '
               f"{format_duration(config.regression_recent)} against the "
               f"{format_duration(config.regression_baseline)} before."),
        _alert(config, "ArgusHostStall",
               "(\n"
               f"  increase({seconds}[{host}]) - increase({gpu}[{host}])\n"
               "  - on (job) group_left job:argus_host_seconds:median_increase\n"
               ")\n"
               ">= on (job) group_left\n"
               f"  {config.attribution_share} * (job:argus_step_window_seconds:max"
               " - job:argus_step_window_seconds:median)\n"
               f"and on (job) job:argus_iteration_spike:settled_ratio >= {spike}",
               config.for_host, "warning", "L1",
               "A rank stalled on the host and slowed its job.",
               "Rank {{ $labels.rank }} (host {{ $labels.host }}) of job {{ $labels.job }} "
               "spent {{ $value | humanizeDuration }} more host time (wall - GPU) than the "
               f"job's median rank over the last {host}, enough to explain the job's slowest "
               "step: its GPU sat idle while the other ranks waited for it."),
    ]


def l2_alerts(config: RulesConfig) -> list[dict]:
    """Ranks slower than their axis group in a compute phase; groups whose collective is slow
    even for their last arriver (a link)."""
    sel = config.selectors.exporters
    phases = select("argus_phase_window_seconds", STAT_MEDIAN, compute_phases(), sel)
    straggler_parts, link_parts = [], []
    for axis in config.axes:
        group = group_labels(axis, "phase")
        on_axis = f'{{axis="{axis}"}}'
        straggler_parts.append(
            "(\n"
            f"  {phases}\n"
            f"  > on ({group}) group_left\n"
            f"  axis_group:argus_phase_seconds:threshold{on_axis}\n"
            ")\n"
            f"/ on ({group}) group_left (axis)\n"
            f"axis_group:argus_phase_seconds:median{on_axis}")
        comm = select("argus_phase_window_seconds", STAT_MEDIAN, axis_phases(axis), sel)
        link_parts.append(
            f"0 * {comm}\n"
            f"+ on ({group}) group_left (axis)\n"
            "(\n"
            f"  (\n    axis_group:argus_collective_seconds:min{on_axis}\n"
            "    > on (job, phase) group_left\n"
            f"    job_phase:argus_collective_group_min_seconds:threshold{on_axis}\n  )\n"
            "  / on (job, phase) group_left\n"
            f"  job_phase:argus_collective_group_min_seconds:median{on_axis}\n"
            ")")
    return [
        _alert(config, "ArgusStragglerRank", _union(straggler_parts),
               config.for_straggler, "critical", "L2",
               "A rank is a straggler in a compute phase.",
               "Rank {{ $labels.rank }} (host {{ $labels.host }}) of job {{ $labels.job }} "
               'takes {{ $value | printf "%.2f" }}x the median of its {{ $labels.axis }} group '
               "in phase {{ $labels.phase }} (median of its last "
               f"{config.exporter_window_steps} steps)."),
        _alert(config, "ArgusLinkDegraded", _union(link_parts),
               config.for_straggler, "critical", "L2",
               "A group of ranks is slow in a collective even when nobody is late.",
               "Rank {{ $labels.rank }} (host {{ $labels.host }}) of job {{ $labels.job }}: "
               "its {{ $labels.axis }} group's shortest {{ $labels.phase }} is "
               '{{ $value | printf "%.2f" }}x the median over the other groups: the '
               "collective itself is slow, suspect the link, NIC or switch the group shares."),
    ]


def _union(parts: list[str]) -> str:
    """``max without (stat) (p1 or p2 ...)``: one series per rank, phase and axis."""
    body = "\nor\n".join(parts)
    return "max without (stat) (\n" + _indent(body) + "\n)"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def l3_alerts(config: RulesConfig) -> list[dict]:
    """Kernels the scorer flags (W1 against healthy peers, waiting excused)."""
    sel = config.selectors.scorer
    return [
        _alert(config, "ArgusKernelStraggler",
               f"{select('argus_kernel_w1_score', sel)}\n"
               "and on (job, rank, kernel, stream)\n"
               f"{select('argus_kernel_straggler', sel)} == 1",
               config.for_kernel, "warning", "L3",
               "A rank's GPU kernel is slower than on its peers.",
               "Kernel {{ $labels.kernel }} on stream {{ $labels.stream }} of rank "
               "{{ $labels.rank }} in job {{ $labels.job }} costs "
               "{{ $value | humanizePercentage }} more time than on its healthy peers "
               "(W1 over its duration distribution)."),
    ]


def pipeline_alerts(config: RulesConfig) -> list[dict]:
    """Argus's own plumbing: exporters, processor, scorer."""
    sel = config.selectors
    stale = format_duration(config.scorer_stale_after)
    down = config.for_component_down
    return [
        _alert(config, "ArgusExporterDown", f"{select('up', sel.exporters_up)} == 0",
               config.for_exporter_down, "warning", "pipeline",
               "Prometheus cannot scrape an Argus exporter.",
               "The exporter at {{ $labels.instance }} does not answer: its ranks' step and "
               "phase metrics are missing, so L1 and L2 cannot judge them."),
        _alert(config, "ArgusExporterDroppingRecords",
               "job:argus_exporter_dropped_records:rate > 0", config.for_pipeline, "warning",
               "pipeline", "Argus exporters are dropping trace records.",
               "Job {{ $labels.job }} drops {{ $value | humanize }} records/s "
               "({{ $labels.reason }}): traces and L3 have gaps."),
        _alert(config, "ArgusProcessorDown", f"{select('up', sel.processor_up)} == 0",
               down, "warning", "pipeline", "An Argus processor is down.",
               "The processor at {{ $labels.instance }} does not answer: its host's kernel "
               "summaries (L3) and Perfetto traces stop; exporters drop what they cannot post."),
        _alert(config, "ArgusProcessorRejectingRecords",
               "sum by (instance) (instance:argus_processor_rejected_records:rate)\n"
               "/ (\n  sum by (instance) (instance:argus_processor_rejected_records:rate)\n"
               "  + instance:argus_processor_records:rate\n)\n"
               f"> {config.processor_reject_ratio}",
               config.for_pipeline, "warning", "pipeline",
               "An Argus processor rejects records.",
               "The processor at {{ $labels.instance }} rejects "
               "{{ $value | humanizePercentage }} of the records it receives."),
        _alert(config, "ArgusProcessorUploadFailing",
               "instance:argus_processor_upload_failures:rate > 0", config.for_pipeline,
               "warning", "pipeline", "An Argus processor cannot upload traces.",
               "The processor at {{ $labels.instance }} fails "
               "{{ $value | humanize }} uploads/s to the trace store; files wait in its spool "
               "(argus_processor_spool_bytes) and are dropped once it is full."),
        _alert(config, "ArgusScorerStale",
               f"instance:argus_scorer_last_success:age_seconds > {config.scorer_stale_after:g}"
               f"\nor {select('up', sel.scorer_up)} == 0",
               down, "warning", "pipeline", "The Argus scorer has no recent result.",
               "The scorer at {{ $labels.instance }} has not completed a round for more than "
               f"{stale} (or does not answer): L3 scores and verdicts are missing, by design "
               "never stale."),
    ]
