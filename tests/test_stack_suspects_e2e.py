"""From a degraded leaf switch to a ticket, live: `argus stack up --simulate leaf-switch`.

The simulated job (64 ranks on 8 hosts under 2 leaf switches; leaf-1's ranks' cross-host
all-reduce slower from step 50) goes through the real exporters' metrics, the processor, the
scorer, Prometheus' rules, Alertmanager's generated routing and `argus act` (a dry run): the
scorer names leaf-1 (``argus_suspect``), ArgusSuspectUnit reaches Alertmanager with the leaf
in its labels, and act turns it into a ticket once it has fired for its hold. No alert names a
rank outside the leaf. The Suspects dashboard has data in every panel.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from promtools import binary
from test_stack_e2e import argus, firing, onset, query, wait_for

from argus_core.rules.alerts import FAIL_SLOW
from argus_core.rules.config import format_duration
from argus_core.stack.stack import Stack, StackConfig

JOB = "leaf-switch"
LEAF_RANKS = {str(r) for r in range(48, 64)}  # the ranks under leaf-1 (simulate/cases.py)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    for name in ("prometheus", "prometheus-alertmanager"):
        binary(name)
    workdir = tmp_path_factory.mktemp("stack-leaf")
    result = argus("stack", "up", "--workdir", str(workdir), "--simulate", JOB)
    assert result.returncode == 0, result.stderr
    yield Stack.load(workdir)
    if (workdir / "stack.json").exists():
        argus("stack", "down", "--workdir", str(workdir))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def test_the_degraded_leaf_reaches_alertmanager_named(stack):
    at, labels = wait_for(stack, "ArgusSuspectUnit for the leaf",
                          lambda lab: lab["alertname"] == "ArgusSuspectUnit", timeout=150)
    print(f"\nArgusSuspectUnit reached the webhook {at - onset(stack, JOB):.1f} s after the "
          "fault began")
    assert (labels["job"], labels["unit_kind"], labels["unit"], labels["cause"]) == (
        JOB, "leaf", "leaf-1", "communication")
    assert labels["hosts"] == "node-6, node-7"
    deadline = time.monotonic() + 30  # the alert was on the scorer's series a round ago
    while not (infos := query(stack, f'argus_suspect_info{{job="{JOB}", shared="true"}}')):
        assert time.monotonic() < deadline, "argus_suspect_info gone after the alert fired"
        time.sleep(0.5)
    assert [i["metric"]["ranks"] for i in infos] == ["48-63"]
    units = {(s["metric"]["unit_kind"], s["metric"]["unit"])
             for s in query(stack, f'argus_suspect{{job="{JOB}"}}')}
    assert units == {("leaf", "leaf-1")}


def test_argus_act_tickets_the_leaf_after_its_hold(stack):
    """The hold (10 m / the stack's time scale) passes, then the plan is a ticket (no
    command drains a switch), on /plan, /metrics and the audit log; nothing ran."""
    deadline = time.monotonic() + 150
    while True:
        plan = {s["unit"]: s for s in json.loads(_get(stack.urls["act"] + "/plan"))}
        if plan.get("leaf-1", {}).get("state") == "ticket":
            break
        assert time.monotonic() < deadline, f"act's plan: {plan}"
        time.sleep(0.5)
    assert set(plan) == {"leaf-1"} and plan["leaf-1"]["argv"] == []
    metrics = _get(stack.urls["act"] + "/metrics")
    assert 'unit="leaf-1"' in metrics and 'state="ticket"' in metrics
    audit = [json.loads(line) for line in
             (stack.workdir / "act-audit.ndjson").read_text().splitlines()]
    assert [a["state"] for a in audit if a["unit"] == "leaf-1"][:2] == ["holding", "ticket"]


def test_no_alert_names_a_rank_outside_the_leaf(stack):
    ranks = {labels["rank"] for _, labels in firing(stack)
             if labels["alertname"] in FAIL_SLOW and labels.get("rank")}
    assert ranks and ranks <= LEAF_RANKS, sorted(ranks - LEAF_RANKS, key=int)


def test_the_suspects_dashboard_has_data_in_every_panel(stack):
    """Grafana's view: every query of the Suspects dashboard, and the Stragglers dashboard's
    host and leaf panels, return data for this job."""
    from argus_grafana import check, generate

    scrape_s = StackConfig(stack.workdir).rules.scrape_interval
    boards = {uid: json.loads(generate.encode(generate.BUILDERS[uid]()))
              for uid in ("argus-suspects", "argus-stragglers")}
    report = check.check_all(stack.urls["prometheus"], job=JOB,
                             rate_interval=format_duration(4 * scrape_s), range_="3m",
                             values={"axis": "dp"}, boards=boards)
    wanted = [o for o in report.outcomes if o.dashboard == "argus-suspects"
              or "host and leaf" in o.where]
    assert len(wanted) >= 10
    assert all(o.status == "ok" for o in wanted), "\n".join(
        o.line() for o in wanted if o.status != "ok")


def test_down_stops_every_process(stack):
    started = Stack.load(stack.workdir).processes
    assert "act" in {p.name for p in started}
    result = argus("stack", "down", "--workdir", str(stack.workdir))
    assert result.returncode == 0, result.stderr
    assert not [p.name for p in started if p.running]
