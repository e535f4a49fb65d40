"""L1, the Fail-slow overview: is a job slow, since when, and what has it cost.

Iteration time per job with spike and regression markers and the Argus alerts as annotations,
steps per minute, and the GPU-hours lost to fail-slow (time above the job's healthy pace x
ranks). Each job links to the Stragglers dashboard.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models import dashboard as dm

from argus_grafana import panels as p
from argus_grafana.queries import Queries, queries_for

UID = p.UIDS["overview"]


def _annotation(name: str, expr: str, color: str) -> dashboard.AnnotationQuery:
    return (dashboard.AnnotationQuery().name(name).datasource(p.DATASOURCE).expr(expr)
            .icon_color(color).enable(True).hide(False))


def build(q: Queries | None = None) -> dm.Dashboard:
    """The Fail-slow overview (uid ``argus-overview``). Its queries are ``q``
    (default: the default config's)."""
    q = q or queries_for()
    to_stragglers = p.drilldown("Stragglers of ${__field.labels.job}", p.UIDS["stragglers"],
                                "var-job=${__field.labels.job}")
    board = (p.new_dashboard(
        UID, "Argus / Fail-slow overview",
        "L1: each job's iteration time (its slowest rank), spikes, regressions, Argus alerts "
        "and the GPU-hours lost to fail-slow. Start here when an Argus alert fires.",
        ["L1"], [p.datasource_variable(), p.job_variable(q, multi=True)])
        .annotation(_annotation(f"Spikes (slowest recent step >= {q.SPIKE_RATIO:g}x median)",
                                q.SPIKE_MARKERS, "orange"))
        .annotation(_annotation("Regressions (rules: recent over baseline >= its threshold)",
                                q.REGRESSION_MARKERS, "red"))
        .annotation(_annotation("Argus alerts", q.ARGUS_ALERTS, "purple"))
        .with_panel(p.stat_panel(
            "Iteration time", "The job's iteration time now: the slowest rank's mean step "
            "time over the rate interval (synchronous training runs at its slowest rank's "
            "speed).", "s", p.query(q.ITERATION_SECONDS, "{{job}}", instant=True)))
        .with_panel(p.stat_panel(
            "Steps per minute", "Training steps completed per minute (the slowest rank's "
            "rate).", "short", p.query(q.STEPS_PER_MINUTE, "{{job}}", instant=True)))
        .with_panel(p.stat_panel(
            "GPU-hours lost to fail-slow", "Over the range shown: (elapsed time - steps x the "
            "job's best 5-minute iteration time in the range) x ranks, in GPU-hours. Widen "
            "the range to include healthy time if the job was slow throughout.", "h",
            p.query(q.GPU_HOURS_LOST, "{{job}}", instant=True),
            steps=p.above((1.0, "orange"), (10.0, "red")), decimals=1))
        .with_panel(p.stat_panel(
            "Ranks reporting", "Ranks whose exporters Prometheus has step counters for.",
            "short", p.query(q.RANKS, "{{job}}", instant=True)))
        .with_panel(p.timeseries(
            "Iteration time per job", "Slowest rank's mean step time (solid), the slowest of "
            "its last N steps (window max: spikes), and the L1 rules' baseline: the job's best "
            f"pace (lowest {q.REGRESSION_RECENT} median) in the {q.REGRESSION_BASELINE} before "
            f"the last {q.REGRESSION_RECENT}, so a lasting slowdown never becomes its own "
            "baseline. Markers: spikes, regressions, Argus alerts.",
            "s", [p.query(q.ITERATION_SECONDS, "{{job}} iteration", ref="A"),
                  p.query(q.SLOWEST_RECENT_STEP, "{{job}} slowest recent step", ref="B"),
                  p.query(q.BASELINE_SECONDS, "{{job}} baseline", ref="C")],
            w=24, h=9, minimum=0, links=[to_stragglers]))
        .with_panel(p.timeseries(
            "Spike ratio", "Slowest of each job's last N steps over their median (exporters' "
            f"rolling windows). L1 calls >= {q.SPIKE_RATIO}x a spike (dashed line).", "x",
            [p.query(q.SPIKE_RATIO_NOW, "{{job}}")], w=8,
            steps=p.above((q.SPIKE_RATIO, "red")), threshold_line=True, minimum=1))
        .with_panel(p.timeseries(
            "Regression ratio", f"Median iteration time of the last {q.REGRESSION_RECENT} over "
            "the job's best pace before it (L1 recording rule), and the threshold a regression "
            f"must reach: >= {q.MIN_REGRESSION:g}x, or more for a job whose pace "
            f"wanders from one {q.REGRESSION_RECENT} to the next.", "x",
            [p.query(q.REGRESSION_RATIO, "{{job}}", ref="A"),
             p.query(q.REGRESSION_THRESHOLD, "{{job}} threshold", ref="B")], w=8,
            steps=p.above((q.MIN_REGRESSION, "red")), threshold_line=True))
        .with_panel(p.timeseries(
            "GPUs lost now", "Ranks x the share of each step spent above the job's best "
            "5-minute pace: how many GPUs' worth of time fail-slow is burning right now "
            "(integrated over time, GPU-hours).", "short",
            [p.query(q.GPUS_LOST, "{{job}}")], w=8, steps=p.above((1.0, "orange")),
            minimum=0, stack=True))
        .with_panel(p.timeseries(
            "Steps per minute", "Training throughput per job.", "short",
            [p.query(q.STEPS_PER_MINUTE, "{{job}}")], w=12, minimum=0))
        .with_panel(p.table(
            "Firing Argus alerts", "Argus alerts firing now for the selected jobs, with the "
            "rank they name (L2/L3/host) and their level.", "short",
            [p.query(q.FIRING_ALERTS, instant=True, table=True)], w=12,
            transformations=[p.transformation("organize", excludeByName={"Time": True,
                                                                          "Value": True})])))
    return p.assign_ids(board.build())
