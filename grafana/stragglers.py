"""L2, Stragglers: which rank, in which phase, compared with the peers of its parallel group.

A rank x phase matrix of the ratio to the group median along ``$axis`` (the ranks that differ
from it only on that axis), the same over time, the worst ranks with their robust z and the
scorer's verdict, and for ``$rank`` its phases against its group's median. Host time and
waiting measured from arrival skew tell host stalls and late arrivals apart from slow compute;
the scorer's findings table lists every L2 finding of the core, including what PromQL cannot
judge (pipeline stages, pairs, collectives).
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from argus_grafana import panels as p
from argus_grafana.queries import Queries, queries_for

UID = p.UIDS["stragglers"]


def build(q: Queries | None = None) -> dm.Dashboard:
    """The Stragglers dashboard (uid ``argus-stragglers``). Its queries are ``q``
    (default: the default config's)."""
    q = q or queries_for()
    ratio_steps = p.above((q.L2_MIN_RATIO, "orange"), (1.5, "red"))
    rank_drill = p.drilldown("Rank ${__data.fields.rank}: phases", UID,
                             "var-job=${job}&var-axis=${axis}&var-rank=${__data.fields.rank}")
    to_kernels = p.drilldown("Rank ${__data.fields.rank}: kernels", p.UIDS["kernels"],
                             "var-job=${job}&var-rank=${__data.fields.rank}")
    series_drill = p.drilldown("Rank ${__field.labels.rank}: phases", UID,
                               "var-job=${job}&var-axis=${axis}&var-rank=${__field.labels.rank}")
    board = (p.new_dashboard(
        UID, "Argus / Stragglers",
        "L2: each rank's compute-phase time against the median of its group on the chosen "
        "parallel axis (ranks equal on every other coordinate), the worst ranks with their "
        "verdict, and one rank's phases over time.",
        ["L2"], [p.datasource_variable(), p.job_variable(q, multi=False), p.axis_variable(q),
                 p.query_variable("rank", "Rank", q.VAR_RANK, "Rank to drill into.",
                                  numeric=True)])
        .with_panel(p.table(
            "Rank x phase: ratio to the $axis group median", "Each rank's compute-phase time "
            "(median of its last N steps) over the median of its $axis group, now. "
            f"L2 flags >= {q.L2_MIN_RATIO:g}x with a robust z past the job's family-wise "
            f"threshold (never below {q.L2_Z:g}). Communication phases are left out: waiting "
            "in a collective is not being slow (see the waiting panel and the scorer's "
            "findings). Empty on an axis whose groups are pairs: a pair is decided by who "
            "waits for whom, in the scorer's findings below.",
            "x", [p.query(q.RANK_PHASE_RATIO_MATRIX, instant=True, table=True)],
            steps=ratio_steps, colored=True, w=12, h=10, links=[rank_drill, to_kernels],
            transformations=[p.transformation("groupingToMatrix", columnField="phase",
                                              rowField="rank", valueField="Value")]))
        .with_panel(p.table(
            "Worst ranks", "The ten slowest (rank, phase) pairs against their $axis group: the "
            "ratio, the robust z (ln(time / group median) over the spread pooled across the $axis "
            "groups, both the core's L2 statistics) and the scorer's verdict for the rank. "
            "Click a rank to drill down.", "x",
            [p.query(q.WORST_RANKS, instant=True, table=True, ref="A"),
             p.query(q.WORST_RANKS_Z, instant=True, table=True, ref="B"),
             p.query(q.VERDICTS, instant=True, table=True, ref="C")],
            steps=ratio_steps, colored=True, w=12, h=10, links=[rank_drill, to_kernels],
            column_units={"robust z": "none"},
            transformations=[
                p.transformation("merge"),
                p.transformation("organize", excludeByName={"Time": True, "Value #C": True},
                                 renameByName={"Value #A": "ratio", "Value #B": "robust z",
                                               "cause": "verdict"}),
                p.transformation("sortBy", sort=[{"field": "ratio", "desc": True}])]))
        .with_panel(p.heatmap_panel(
            "Worst compute-phase ratio per rank over time", "For each rank, its slowest "
            "compute phase against its $axis group's median, over time: a straggler is a row "
            "that turns red, and when it started shows on the time axis.", "x",
            p.query(q.WORST_PHASE_RATIO_BY_RANK, "{{rank}}"), links=[series_drill]))
        .with_panel(p.timeseries(
            "Rank $rank: phases against its $axis group median", "The selected rank's "
            "compute-phase times, its $axis group's median per phase and the time above which "
            "L2 flags it (the scorer's, or the L2 rules' with l2_source: promql). A rank that "
            "crosses its threshold and stays there is a straggler.", "s",
            [p.query(q.RANK_PHASE_SECONDS, "rank $rank {{phase}}", ref="A"),
             p.query(q.RANK_GROUP_MEDIAN, "group median {{phase}}", ref="B"),
             p.query(q.RANK_GROUP_THRESHOLD, "flagged above {{phase}}", ref="C")],
            w=24, h=9, minimum=0))
        .with_panel(p.table(
            "Scorer's L2 findings: every rank and phase the core flags", "Every L2 finding "
            "of the core's own L2, from the scorer, with its axis and kind: ranks slow against "
            "their group on any axis, pipeline stages compared only where they do alike work, "
            "pairs decided by who waits, and collectives judged on their transfer time with "
            "the waiting for late arrivers removed (kind communication: suspect the link). "
            "Empty when nothing is found.", "x",
            [p.query(q.SCORER_PHASE_FINDINGS, instant=True, table=True)],
            steps=ratio_steps, colored=True, w=24, h=7, links=[rank_drill, to_kernels],
            transformations=[p.transformation("organize", excludeByName={"Time": True},
                                              renameByName={"Value": "ratio"}),
                             p.transformation("sortBy",
                                              sort=[{"field": "ratio", "desc": True}])]))
        .with_panel(p.table(
            "Worst ratio by host and leaf switch", "Each host's slowest rank against its "
            "$axis group (worst compute phase), with the leaf switch above the host: one slow "
            "host, or every host under one leaf, stands out as a block. Hosts and switches "
            "come from the ranks' placement (docs/exporters.md).", "x",
            [p.query(q.WORST_RATIO_BY_HOST, instant=True, table=True)],
            steps=ratio_steps, colored=True, w=12, h=8,
            transformations=[p.transformation("organize", excludeByName={"Time": True},
                                              renameByName={"Value": "worst ratio"}),
                             p.transformation("sortBy",
                                              sort=[{"field": "worst ratio", "desc": True}])]))
        .with_panel(p.table(
            "Verdicts by host and leaf switch", "The scorer's verdicts counted per host and "
            "cause: several on one host or one leaf point at the hardware they share (the "
            "Suspects dashboard names the unit).", "none",
            [p.query(q.VERDICTS_BY_HOST, instant=True, table=True)], w=12, h=8,
            links=[p.drilldown("Suspects", p.UIDS["suspects"], "var-job=${job}")],
            transformations=[p.transformation("organize", excludeByName={"Time": True},
                                              renameByName={"Value": "verdicts"}),
                             p.transformation("sortBy",
                                              sort=[{"field": "verdicts", "desc": True}])]))
        .with_panel(p.timeseries(
            "Host time per step (wall - GPU)", "Per rank, host-side time per step: a rank "
            "stalled on the host (JIT compilation, GC, data loading) rises here while its GPU "
            "time stays flat, and the whole job waits for it.", "s",
            [p.query(q.HOST_SECONDS_PER_STEP, "rank {{rank}}")], w=12, minimum=0,
            links=[series_drill]))
        .with_panel(p.timeseries(
            "Waiting for late peers", "Per rank, the time per step it waits in collectives "
            "for peers that arrive later (the scorer measures arrival skew: when each rank "
            "entered the collective against the last arriver). The ranks that wait are "
            "victims; the one that never waits arrives last and is the one to look at.", "s",
            [p.query(q.RANK_WAIT_SECONDS, "rank {{rank}}")], w=12, minimum=0,
            links=[series_drill])))
    return p.assign_ids(board.build())
