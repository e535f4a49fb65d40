"""L3, Kernels: which kernel of which rank degraded, and its Perfetto trace one click away.

W1 scores per rank (the scoring job), the p50/p99 of a chosen kernel across ranks and its
clusters (the processors' window summaries), the degraded kernels as a table, and on every
per-rank series a data link that opens that rank's Perfetto file for the clicked time.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from argus_grafana import panels as p
from argus_grafana.queries import L3_MIN_SCORE, Queries, queries_for

UID = p.UIDS["kernels"]
SCORE_STEPS = p.above((L3_MIN_SCORE, "orange"), (0.5, "red"))


def build(q: Queries | None = None) -> dm.Dashboard:
    """The Kernels dashboard (uid ``argus-kernels``). Its queries are ``q``
    (default: the default config's)."""
    q = q or queries_for()
    traces = p.trace_links("${__field.labels.rank}", job="${job:percentencode}")
    table_traces = p.trace_links("${__data.fields.rank}", job="${job:percentencode}",
                                 at="${__data.fields.Time}")
    board = (p.new_dashboard(
        UID, "Argus / Kernels",
        "L3: kernel-time distributions per rank (the processors' window summaries), their W1 "
        "scores against the rank's peers (the scoring job), and each rank's Perfetto trace for "
        "the minute you click.",
        ["L3"], [p.datasource_variable(), p.job_variable(q, multi=False),
                 p.query_variable("rank", "Rank", q.VAR_KERNEL_RANK,
                                  "Ranks to show (all by default).", multi=True, numeric=True),
                 p.query_variable("kernel", "Kernel", q.VAR_KERNEL,
                                  "Kernel whose distribution is shown."),
                 p.traces_variable(), p.read_token_variable()])
        .with_panel(p.timeseries(
            "W1 score per rank", "Each rank's worst kernel score: directional Wasserstein-1 "
            "extra time over its peers' robust reference (+100% = twice as slow). L3 flags "
            f">= {q.L3_MIN_SCORE:.0%} past a Bonferroni fence. Click a point to open that rank's "
            "Perfetto trace for that time.", "percentunit",
            [p.query(q.W1_SCORE_BY_RANK, "rank {{rank}}")], w=12, steps=SCORE_STEPS,
            threshold_line=True, minimum=0, links=traces))
        .with_panel(p.table(
            "Degraded kernels", "Kernels the scoring job flags now (argus_kernel_straggler = "
            "1), with their W1 score. Click a rank for its Perfetto trace.", "percentunit",
            [p.query(q.DEGRADED_KERNELS, instant=True, table=True)], w=12,
            steps=SCORE_STEPS, colored=True, links=table_traces,
            transformations=[p.transformation("organize", excludeByName={"__name__": True},
                                              renameByName={"Value": "W1 score"})]))
        .with_panel(p.timeseries(
            "$kernel p50 by rank", "Median duration of $kernel per rank and cluster in each "
            "closed window (a bimodal kernel, e.g. two all-reduce bucket sizes, has two "
            "clusters). Click a point for that window's Perfetto trace.", "s",
            [p.query(q.KERNEL_P50, "rank {{rank}} c{{cluster}}")], w=12, minimum=0,
            links=traces))
        .with_panel(p.timeseries(
            "$kernel p99 by rank", "99th percentile duration of $kernel per rank and cluster "
            "in each closed window: a tail that grows on some ranks only is a degraded device "
            "or link.", "s", [p.query(q.KERNEL_P99, "rank {{rank}} c{{cluster}}")], w=12,
            minimum=0, links=traces))
        .with_panel(p.bar_gauge(
            "$kernel p50 across ranks, now", "Latest window's median duration of $kernel per "
            "rank (largest cluster): the odd one out stands out.", "s",
            p.query(q.KERNEL_P50_BY_RANK, "rank {{rank}}", instant=True), w=8))
        .with_panel(p.timeseries(
            "$kernel executions per cluster", "Executions of $kernel per duration cluster in "
            "each window, summed over the selected ranks (KDE valley clustering).", "short",
            [p.query(q.KERNEL_EXECUTIONS_BY_CLUSTER, "cluster {{cluster}}")], w=8, minimum=0,
            stack=True))
        .with_panel(p.table(
            "Clusters per kernel", "Duration clusters per kernel and stream (most over ranks) "
            "in the latest windows: more than one is a multi-modal kernel.", "short",
            [p.query(q.CLUSTERS_PER_KERNEL, instant=True, table=True)], w=8,
            transformations=[p.transformation("organize", excludeByName={"Time": True},
                                              renameByName={"Value": "clusters"})]))
        .with_panel(p.table(
            "Ranks: host and coordinates", "Where each rank runs and its position on every "
            "parallel axis (argus_rank_info). Click a rank for its latest Perfetto trace.",
            "short", [p.query(q.RANK_INFO, instant=True, table=True)], w=24, h=7,
            links=table_traces,
            transformations=[p.transformation("organize", excludeByName={
                "Time": True, "Value": True, "__name__": True, "instance": True})])))
    return p.assign_ids(board.build())
