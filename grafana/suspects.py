"""Suspects: from "these ranks are slow" to the hardware unit to act on, and the plan.

The units the scorer names (``argus_suspect``: the smallest GPU, NIC, PCIe switch, host or
switch the flagged ranks share and healthy ranks do not), their ranks and hosts, what each
costs the job a step and in GPU-hours over the range, the ArgusSuspectUnit alerts, and what
``argus act`` plans to do about them (drain, cordon or ticket; held, refused or done).
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from argus_grafana import panels as p
from argus_grafana.queries import Queries, queries_for

UID = p.UIDS["suspects"]


def build(q: Queries | None = None) -> dm.Dashboard:
    """The Suspects dashboard (uid ``argus-suspects``). Its queries are ``q``
    (default: the default config's)."""
    q = q or queries_for()
    to_stragglers = p.drilldown("Stragglers of ${__data.fields.job}", p.UIDS["stragglers"],
                                "var-job=${__data.fields.job}")
    board = (p.new_dashboard(
        UID, "Argus / Suspects",
        "Hardware: the unit (GPU, NIC, PCIe switch, host, leaf or spine switch) that explains "
        "the slow ranks, with the evidence for and against it, what it costs, and the plan "
        "`argus act` makes (dry run unless it was started with --execute).",
        ["hardware"], [p.datasource_variable(), p.job_variable(q, multi=True)])
        .with_panel(p.table(
            "Suspect units now", "Each unit the scorer names: the slow ranks under it and "
            "their hosts, the healthy ranks under it (counter-evidence), whether several slow "
            "ranks share it (shared=false: one rank's own GPU or NIC, paged through its rank's "
            "alerts), and what it costs the job a step. A shared unit fires ArgusSuspectUnit.",
            "s", [p.query(q.SUSPECT_INFO, instant=True, table=True, ref="A"),
                  p.query(q.SUSPECT_RANKS, instant=True, table=True, ref="B"),
                  p.query(q.SUSPECT_COST, instant=True, table=True, ref="C")],
            w=24, h=8, links=[to_stragglers],
            column_units={"slow ranks": "none", "cost a step": "s"},
            transformations=[
                p.transformation("merge"),
                p.transformation("organize", excludeByName={"Time": True, "Value #A": True,
                                                             "instance": True},
                                 renameByName={"Value #B": "slow ranks",
                                               "Value #C": "cost a step",
                                               "ranks": "which ranks",
                                               "healthy_under": "healthy under it"}),
                p.transformation("sortBy", sort=[{"field": "cost a step", "desc": True}])]))
        .with_panel(p.timeseries(
            "Slow ranks under each suspect", "How many slow ranks each unit explains, over "
            "time: a unit that stays named round after round is what ArgusSuspectUnit and "
            "`argus act` wait for (a flapping one is never acted on).", "none",
            [p.query(q.SUSPECT_RANKS, "{{job}} {{unit_kind}} {{unit}} ({{cause}})")],
            w=12, minimum=0))
        .with_panel(p.timeseries(
            "Share of the step each suspect costs", "Each unit's cost a step (the largest "
            "excess of its ranks: how much shorter the step would be without it) over the "
            "job's iteration time.", "percentunit",
            [p.query(q.SUSPECT_COST_SHARE, "{{job}} {{unit_kind}} {{unit}}")],
            steps=p.above((0.02, "orange"), (0.1, "red")), w=12, minimum=0))
        .with_panel(p.stat_panel(
            "GPU-hours lost to suspects", "Over the range shown: each unit's share of the step "
            "x the job's ranks, every 15 s, summed over units (an upper bound where two "
            "units slow the same steps).", "h",
            p.query(f"sum({q.SUSPECT_GPU_HOURS})", instant=True),
            steps=p.above((1, "orange"), (100, "red")), w=6, decimals=1))
        .with_panel(p.stat_panel(
            "argus act", "1: `argus act --execute` runs the drain commands; 0: a dry run that "
            "only plans (the default).", "none", p.query(q.ACT_EXECUTE, instant=True),
            steps=p.above((1, "orange")), w=6))
        .with_panel(p.table(
            "ArgusSuspectUnit firing", "Shared units paged as tickets (warning): the alert "
            "holds the unit, its hosts and its cause, and goes to `argus act` as well as to "
            "the ticket receiver.", "none",
            [p.query(q.SUSPECT_ALERTS, instant=True, table=True)], w=12,
            transformations=[p.transformation("organize", excludeByName={
                "Time": True, "Value": True, "__name__": True, "alertstate": True,
                "instance": True})]))
        .with_panel(p.table(
            "The plan (argus act)", "What `argus act` does about each unit: holding (named for "
            "less than its hold), planned (a dry run's drain), executed or failed, "
            "refused_budget (more nodes this hour than the budget), refused_last_node (the "
            "job's last node not drained), ticket (a switch: no command drains it), resolved.",
            "none", [p.query(q.ACT_PLAN, instant=True, table=True)], w=12,
            transformations=[p.transformation("organize", excludeByName={
                "Time": True, "Value": True, "__name__": True, "instance": True})]))
        .with_panel(p.bar_gauge(
            "Decisions over the range", "Every decision `argus act` took in the range, by "
            "state (its audit log has one line each).", "none",
            p.query(q.ACT_DECISIONS, "{{state}}", instant=True), w=12)))
    return p.assign_ids(board.build())
