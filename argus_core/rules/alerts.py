"""Alerting rules: L1 (spike, regression, host stall), L2 (straggler rank, rank short of CPU,
degraded link), L3 (kernel straggler and the hardware unit slow ranks share, from the
scorer) and the pipeline's own health.

Every alert has ``severity``, ``level``, a static ``summary``, a ``description`` naming the job,
rank, phase or kernel and the ratio, and a ``runbook_url`` into docs/runbook.md. Per-rank
arithmetic happens here, after a comparison with a small recorded threshold has already
reduced each 10,000-rank vector to the ranks that stand out.
"""

from __future__ import annotations

from argus_core.rules.config import L2_PROMQL, RulesConfig, format_duration
from argus_core.rules.promql import compute_phases, group_labels, indent, select
from argus_core.rules.recording import STAT_MEDIAN, on_axis

L1_SYMPTOMS = ("ArgusIterationSpike", "ArgusIterationRegression")
RANK_CAUSES = ("ArgusStragglerRank", "ArgusRankShortOfCPU", "ArgusLinkDegraded",
               "ArgusKernelStraggler", "ArgusHostStall")
FAIL_SLOW = (*L1_SYMPTOMS, *RANK_CAUSES)
# The labels that place each fail-slow alert (besides host and coordinates, which follow from
# job and rank): inhibition compares these (argus_core.rules.alertmanager).
LOCATION = {
    "ArgusIterationSpike": ("job",),
    "ArgusIterationRegression": ("job",),
    "ArgusHostStall": ("job", "rank"),
    "ArgusStragglerRank": ("job", "rank", "phase", "axis"),
    "ArgusRankShortOfCPU": ("job", "rank"),
    "ArgusLinkDegraded": ("job", "rank", "phase", "axis"),
    "ArgusKernelStraggler": ("job", "rank", "kernel", "stream"),
}


def alert_groups(config: RulesConfig) -> list[dict]:
    """Every alerting-rule group."""
    fast, slow = config.evaluation_interval, config.slow_interval
    return [{"name": name, "interval": format_duration(interval), "rules": rules}
            for name, interval, rules in (
                ("argus.alerts.l1", fast, l1_alerts(config)),
                ("argus.alerts.l2", slow, l2_alerts(config)),  # reads the L2 groups' records
                ("argus.alerts.l3", fast, l3_alerts(config)),
                # minutes of `for` on every pipeline alert: a finer refresh buys nothing
                ("argus.alerts.pipeline", slow, pipeline_alerts(config)),
            )]


def _alert(config: RulesConfig, name: str, expr: str, for_s: float, severity: str,
           level: str, summary: str, description: str) -> dict:
    return {"alert": name, "expr": expr, "for": format_duration(for_s),
            "labels": {"severity": severity, "level": level},
            "annotations": {"summary": summary, "description": description,
                            "runbook_url": f"{config.runbook_url}#{name.lower()}"}}


def l1_alerts(config: RulesConfig) -> list[dict]:
    """The job's iteration time: spikes, regressions, and the rank whose host stalled."""
    spike = config.spike_ratio
    host = format_duration(config.host_window)
    return [
        _alert(config, "ArgusIterationSpike",
               f"job:argus_iteration_spike:settled_ratio >= {spike}\n"
               "and on (job)\n"
               "  job:argus_iteration_spike:settled_ratio\n"
               "  >= job:argus_iteration_spike:typical_ratio ^ 2",
               config.for_spike, "warning", "L1",
               "A training job had an iteration-time spike.",
               "Job {{ $labels.job }}: its slowest step of the last "
               f"{config.exporter_window_steps} took "
               '{{ $value | printf "%.1f" }}x the rolling median step time, beyond its own '
               "noise (the square of its usual ratio), and the job is back to its usual pace."),
        _alert(config, "ArgusIterationRegression",
               "job:argus_iteration_regression:ratio\n"
               ">= on (job) job:argus_iteration_regression:threshold",
               config.for_regression, "critical", "L1",
               "A training job's iteration time regressed.",
               "Job {{ $labels.job }} runs "
               '{{ $value | printf "%.2f" }}x slower: median iteration time over the last '
               f"{format_duration(config.regression_recent)} against its best such median in "
               f"the {format_duration(config.regression_baseline)} before, at least "
               f"{config.min_regression:g}x and beyond the job's own wander from one "
               f"{format_duration(config.regression_recent)} to the next."),
        _alert(config, "ArgusHostStall",
               "rank:argus_host_seconds:excess_increase\n"
               ">= on (job) group_left\n"
               f"  {config.attribution_share} * (job:argus_step_window_seconds:max"
               " - job:argus_step_window_seconds:median)\n"
               f"  + {config.min_cost_share * config.host_window:g}\n"
               "and on (job)\n"
               f"  max_over_time(job:argus_iteration_spike:settled_ratio[{host}]) >= {spike}",
               config.for_host, "warning", "L1",
               "A rank stalled on the host and slowed its job.",
               "Rank {{ $labels.rank }} (host {{ $labels.host }}) of job {{ $labels.job }} "
               "spent {{ $value | humanizeDuration }} more host time (wall - GPU) than the "
               f"job's median rank over the last {host}, enough to explain the job's slowest "
               f"step and more than {config.min_cost_share:.0%} of that time: its GPU sat idle "
               "while the other ranks waited for it."),
    ]


def l2_alerts(config: RulesConfig) -> list[dict]:
    """Ranks slower than their axis group in a compute phase; ranks or groups whose
    collective transfer is slow with the waiting for late arrivers removed (the scorer's).

    ``l2_source: scorer``: every compute finding is the scorer's (the core's L2 on every
    axis), and the alert reads only its findings, a handful of series. ``promql``: the
    recording rules' groups of three or more on ``axes`` (one pass over every rank's phases
    per axis), and the scorer's pairs and pipeline stages."""
    sel = config.selectors
    phases = select("argus_phase_window_seconds", STAT_MEDIAN, compute_phases(), sel.exporters)
    scorer = select("argus_phase_straggler_ratio", 'kind="compute"', sel.scorer)
    straggler_parts = []
    for axis in config.axes if config.l2_source == L2_PROMQL else ():
        group = group_labels(axis, "phase")
        median = f"axis_group:argus_phase_seconds:median{on_axis(axis)}"
        # Past the threshold, and costing the job the verdicts' floor: the rank's excess over
        # its group's median is at least min_cost_share of the job's step (the slowest
        # rank's median step, as the scorer measures it).
        straggler_parts.append(
            "(\n"
            f"  {phases}\n"
            f"  > on ({group}) group_left\n"
            f"  axis_group:argus_phase_seconds:threshold{on_axis(axis)}\n"
            "and\n"
            f"  ({phases} - on ({group}) group_left {median})\n"
            f"  >= on (job) group_left {config.min_cost_share:g} * "
            "job:argus_step_window_seconds:median\n"
            ")\n"
            f"/ on ({group}) group_left (axis)\n"
            f"{median}")
    straggler_parts.append(scorer)
    link = select("argus_phase_straggler_ratio", 'kind="communication"', sel.scorer)
    # a rank whose slow phases its wait for a CPU explains is short of CPU, not a straggler
    # in its own work (the scorer's verdict is host): one alert for it, the right one
    short_of_cpu = select("argus_rank_short_of_cpu_seconds", sel.scorer)
    return [
        _alert(config, "ArgusStragglerRank",
               f"{_union(straggler_parts)}\nunless on (job, rank)\n{short_of_cpu}",
               config.for_straggler, "critical", "L2",
               "A rank is a straggler in a compute phase.",
               "Rank {{ $labels.rank }} (host {{ $labels.host }}) of job {{ $labels.job }} "
               'takes {{ $value | printf "%.2f" }}x the median of its {{ $labels.axis }} group '
               "(its partner's in a pair) in phase {{ $labels.phase }} (median of its last "
               f"{config.exporter_window_steps} steps)."),
        _alert(config, "ArgusRankShortOfCPU",
               f"max without (instance) (\n  {short_of_cpu}\n)",
               config.for_straggler, "critical", "L2",
               "A rank is slow because it waits for a CPU.",
               "Rank {{ $labels.rank }} (host {{ $labels.host }}) of job {{ $labels.job }}: "
               "its training thread waited {{ $value | humanizeDuration }} a step longer for "
               "a CPU than the other ranks' (median of their last "
               f"{config.exporter_window_steps} steps), which explains its slow phases: "
               "another process on its cores, or more busy threads than cores. It is not "
               "slow at its own work."),
        _alert(config, "ArgusLinkDegraded", _union([link]),
               config.for_straggler, "critical", "L2",
               "A collective is slow with nobody arriving late.",
               "Rank {{ $labels.rank }} (host {{ $labels.host }}) of job {{ $labels.job }}: "
               "its {{ $labels.phase }} transfer time (the waiting for late arrivers removed) "
               'is {{ $value | printf "%.2f" }}x that of its {{ $labels.axis }} peers: the '
               "collective itself is slow, suspect the link, NIC or switch it uses."),
    ]


def _union(parts: list[str]) -> str:
    """``max without (stat, instance, kind) (p1 or p2 ...)``: one series per rank, phase and
    axis, whichever side (the rules or the scorer) found it."""
    body = "\nor\n".join(parts)
    return "max without (stat, instance, kind) (\n" + indent(body) + "\n)"


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
        _alert(config, "ArgusSuspectUnit",
               f"{select('argus_suspect', sel)}\n"
               "* on (job, unit_kind, unit, cause) group_left (hosts)\n"
               + select("argus_suspect_info", sel, 'shared="true"'),
               config.for_kernel, "warning", "L3",
               "Slow ranks share one piece of hardware that their healthy peers do not.",
               "{{ $value }} slow ranks of job {{ $labels.job }} ({{ $labels.cause }}) on "
               "{{ $labels.hosts }} sit under {{ $labels.unit_kind }} {{ $labels.unit }}, and "
               "the ranks under other units are healthy: suspect that unit "
               "(argus_suspect_info names the ranks)."),
    ]


def pipeline_alerts(config: RulesConfig) -> list[dict]:
    """Argus's own plumbing: exporters, processor, scorer, and Vector's scrapes.

    Exporters and processors are watched in both ways their metrics reach Prometheus: its
    own scrapes (``up == 0``) and Vector's remote write, where Prometheus has no ``up`` for
    them: a rank (a processor) whose series stopped while the rest of its job still reports
    (within ``silent_window``; without staleness markers they vanish after the 5 m lookback).
    Ranks are remembered by the recorded ``rank:argus_steps:last_seen_timestamp`` (a
    Prometheus down longer than the 5 m lookback forgets the ranks that died before it).
    A target that ``up`` already reports down is not reported twice."""
    sel = config.selectors
    stale = format_duration(config.scorer_stale_after)
    silent = format_duration(config.silent_window)
    down = config.for_component_down
    window = format_duration(max(config.rate_window, 4 * config.scrape_interval))
    steps = select("argus_steps_total", sel.exporters)
    records = select("argus_processor_records_total", sel.processor)
    exporters_down = f"{select('up', sel.exporters_up)} == 0"
    processor_down = f"{select('up', sel.processor_up)} == 0"
    return [
        _alert(config, "ArgusExporterDown",
               f"{exporters_down}\n"
               "or\n"
               "(\n"
               "  group by (job, rank, host, instance) (rank:argus_steps:last_seen_timestamp)\n"
               f"  unless on (job, rank) {steps}\n"
               f"  unless on (instance) {exporters_down}\n"
               ")\n"
               # the job still reports: its recorded slowest rank's step count (one read
               # of every rank's counter fewer than `group by (job) (steps)`)
               "and on (job) job:argus_steps:min",
               config.for_exporter_down, "warning", "pipeline",
               "An Argus exporter stopped reporting.",
               "{{ if $labels.rank }}Rank {{ $labels.rank }} (host {{ $labels.host }}) of job "
               "{{ $labels.job }} stopped reporting while the rest of its job still does"
               "{{ else }}The exporter at {{ $labels.instance }} does not answer its scrape"
               "{{ end }}: its step and phase metrics are missing, so L1 and L2 cannot judge "
               "it."),
        _alert(config, "ArgusExporterDroppingRecords",
               "job:argus_exporter_dropped_records:rate > 0", config.for_pipeline, "warning",
               "pipeline", "Argus exporters are dropping trace records.",
               "Job {{ $labels.job }} drops {{ $value | humanize }} records/s "
               "({{ $labels.reason }}): traces and L3 have gaps."),
        _alert(config, "ArgusProcessorDown",
               f"{processor_down}\n"
               "or\n"
               f"group by (instance) (last_over_time({records}[{silent}]))\n"
               f"unless on (instance) {records}\n"
               f"unless on (instance) {processor_down}",
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
        _alert(config, "ArgusProcessorDroppingLate",
               "(\n"
               '  instance:argus_processor_late:rate{kind="kernels"}\n'
               "  / ignoring (kind) group_left instance:argus_processor_kernel_events:rate\n"
               "or\n"
               '  instance:argus_processor_late:rate{kind!="kernels"}\n'
               "  / ignoring (kind) group_left instance:argus_processor_records:rate\n"
               f") > {config.processor_late_ratio}",
               config.for_pipeline, "warning", "pipeline",
               "An Argus processor drops records that arrived late.",
               "The processor at {{ $labels.instance }} dropped "
               "{{ $value | humanizePercentage }} of its {{ $labels.kind }} (of its kernel "
               "events for kernels, of its records for steps and stacks) after accepting "
               "them: their window had already closed. They are missing from the Perfetto "
               "traces (and kernels from the L3 summaries)."),
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
               f"{stale} (or does not answer): "
               f"{'L3' if config.l2_source == L2_PROMQL else 'L2 findings, L3'} scores and "
               "verdicts are missing, by design never stale."),
        _alert(config, "ArgusVectorScrapeFailing",
               "sum by (host) (rate("
               f"{select('vector_component_errors_total', sel.vector_scrape)}[{window}]))"
               " > 0",
               down, "warning", "pipeline",
               "A Vector agent fails to scrape Argus's endpoints.",
               "The Vector agent on {{ $labels.host }} fails {{ $value | humanize }} scrapes/s "
               "of the exporters or the processor it watches (remote-write mode): their "
               "metrics are missing or late."),
    ]
