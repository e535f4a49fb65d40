"""Inhibition that cannot hide incidents, checked against a real Alertmanager.

Debian's ``prometheus-alertmanager`` runs on a loopback port with the committed
alerting/alertmanager.yml (its receivers pointed at a closed port); the tests post alerts to
its API, silence some, and read back which alerts are inhibited (``status.inhibitedBy``),
which Alertmanager evaluates when asked. Each scenario is posted together with a control pair
(a regression and a spike of their own job, the one inhibition every version of the config
has), and read only once the control spike shows inhibited: by then Alertmanager has taken in
every source posted before it.

The cases: a silenced cause, a ticket-level cause and an old straggler never hide a page or
a second slowdown of the same job; alerts without a ``job`` inhibit nothing; a regression or a
host stall still hides the same job's spike; and, as the runbook warns, a silenced source
still inhibits (Alertmanager's behaviour, which no config changes).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from am_support import Alertmanager
from support import wait_for

from argus_core.rules.alertmanager import inhibit_rule
from argus_core.rules.alerts import LOCATION, RANK_CAUSES
from argus_core.rules.generate import ALERTMANAGER_FILE, ALERTS_FILE

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / ALERTMANAGER_FILE  # the shipped config under test

_RULES = [rule for group in yaml.safe_load((REPO / ALERTS_FILE).read_text())["groups"]
          for rule in group["rules"]]
RULE_LABELS = {rule["alert"]: rule["labels"] for rule in _RULES}
PLACE = {"rank": "3", "host": "node-3", "phase": "fwd", "axis": "dp", "kernel": "sm90_gemm",
         "stream": "7"}


def alert(name: str, job: str | None, **labels: str) -> dict[str, str]:
    """The labels ``name`` fires with (its severity and level, ``job`` unless None, and the
    rest of its place from ``PLACE`` unless given)."""
    out = {"alertname": name, **RULE_LABELS[name]}
    if job is not None:
        out["job"] = job
    for label in LOCATION[name]:
        if label != "job":
            out[label] = labels.get(label, PLACE[label])
    return {**out, **labels}


@pytest.fixture(scope="module")
def am(tmp_path_factory):
    """One Alertmanager for the module (each test uses jobs of its own)."""
    manager = Alertmanager(tmp_path_factory.mktemp("alertmanager"), CONFIG)
    yield manager
    manager.stop()


class Scenario:
    """Alerts of fresh jobs (a unique suffix), read back once Alertmanager has taken them in."""

    def __init__(self, am: Alertmanager):
        self.am = am
        self.suffix = uuid.uuid4().hex[:8]
        self.silenced: list[dict[str, str]] = []

    def job(self, name: str) -> str:
        """A job name of this scenario only."""
        return f"{name}-{self.suffix}"

    def silence(self, labels: dict[str, str]) -> None:
        """Silence this alert (by name and job) before the scenario is read."""
        self.am.silence(alertname=labels["alertname"], job=labels["job"])
        self.silenced.append(labels)

    def status(self) -> dict[tuple, dict]:
        """Labels (as a sorted tuple) -> status, once the control spike is inhibited and every
        silenced alert shows silenced."""
        control = alert("ArgusIterationSpike", self.job("control"))
        self.am.post([alert("ArgusIterationRegression", self.job("control")), control])

        def ready():
            by_labels = {_key(a["labels"]): a["status"] for a in self.am.alerts()}
            done = (by_labels.get(_key(control), {}).get("inhibitedBy")
                    and all(by_labels.get(_key(s), {}).get("silencedBy")
                            for s in self.silenced))
            return by_labels if done else None

        return wait_for(ready, "the control spike inhibited, the silenced alerts silenced")


def _key(labels: dict[str, str]) -> tuple:
    return tuple(sorted(labels.items()))


def _page_reaches_someone(status: dict) -> bool:
    return (status["state"] == "active" and not status["inhibitedBy"]
            and not status["silencedBy"])


# ------------------------------------------------------------------ the generated rules

def test_no_rule_can_hide_a_page_or_match_a_missing_label():
    """Every inhibit rule's targets are tickets, its sources at least tickets, and every
    label it compares is required non-empty on both sides."""
    config = yaml.safe_load(CONFIG.read_text())
    assert config["inhibit_rules"]
    for rule in config["inhibit_rules"]:
        assert 'severity="warning"' in rule["target_matchers"], rule
        assert 'severity=~"warning|critical"' in rule["source_matchers"], rule
        for label in rule["equal"]:
            assert f'{label}!=""' in rule["source_matchers"], rule
            assert f'{label}!=""' in rule["target_matchers"], rule


def test_each_alert_carries_the_labels_that_place_it():
    """LOCATION (what inhibition compares) is what the promtool tests expect on each alert."""
    carried: dict[str, set[str]] = {}
    for path in REPO.glob("alerting/tests/*.test.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("alert_rule_test", ()):
                for expected in check["exp_alerts"]:
                    carried.setdefault(check["alertname"], set()).update(expected["exp_labels"])
    for name, place in LOCATION.items():
        assert set(place) <= carried[name], name


@pytest.mark.parametrize(("sources", "target", "message"), [
    (("ArgusStragglerRank",), "ArgusIterationRegression", "never inhibited"),
    (("ArgusIterationSpike",), "ArgusHostStall", "does not name"),
])
def test_a_rule_that_could_hide_an_incident_is_refused(sources, target, message):
    severity = {name: labels["severity"] for name, labels in RULE_LABELS.items()}
    with pytest.raises(ValueError, match=message):
        inhibit_rule(sources, target, severity)


# ------------------------------------------------------------------ a real Alertmanager

@pytest.mark.parametrize("cause", RANK_CAUSES)
def test_a_silenced_cause_does_not_hide_the_page(am, cause):
    """A cause someone silenced (known, being handled) still inhibits in Alertmanager: it must
    not be able to inhibit the job's regression page, or nobody is told of it."""
    scenario = Scenario(am)
    job = scenario.job("d")
    source, page = alert(cause, job), alert("ArgusIterationRegression", job)
    am.post([source])
    scenario.silence(source)
    am.post([page])
    status = scenario.status()
    assert status[_key(source)]["silencedBy"]
    assert _page_reaches_someone(status[_key(page)]), status[_key(page)]


@pytest.mark.parametrize("cause", [name for name in RANK_CAUSES
                                   if RULE_LABELS[name]["severity"] == "warning"])
def test_a_ticket_does_not_hide_a_page(am, cause):
    """A warning-level cause (routed to tickets) does not inhibit a critical page."""
    scenario = Scenario(am)
    job = scenario.job("d")
    page = alert("ArgusIterationRegression", job)
    am.post([alert(cause, job), page])
    status = scenario.status()
    assert _page_reaches_someone(status[_key(page)]), status[_key(page)]


@pytest.mark.parametrize("second", [
    alert("ArgusIterationRegression", "-"), alert("ArgusIterationSpike", "-"),
    alert("ArgusStragglerRank", "-", rank="7", phase="bwd"),
    alert("ArgusKernelStraggler", "-", rank="7")], ids=lambda labels: labels["alertname"])
def test_an_old_straggler_does_not_hide_a_second_slowdown(am, second):
    """A straggler firing for hours (known) and a new slowdown of the same job: the new
    regression, spike, or straggler elsewhere is told."""
    scenario = Scenario(am)
    job = scenario.job("d")
    old = alert("ArgusStragglerRank", job, rank="3", phase="fwd")
    am.post([old], started=datetime.now(UTC) - timedelta(hours=6))
    new = {**second, "job": job}
    am.post([new])
    status = scenario.status()
    assert not status[_key(new)]["inhibitedBy"], status[_key(new)]


def test_alerts_without_a_job_inhibit_nothing(am):
    """Alertmanager takes a missing label for an equal empty one: a source and a target that
    both lack ``job`` must not match."""
    scenario = Scenario(am)
    spike = alert("ArgusIterationSpike", None)
    am.post([alert("ArgusIterationRegression", None), alert("ArgusHostStall", None), spike])
    status = scenario.status()
    assert not status[_key(spike)]["inhibitedBy"], status[_key(spike)]


def test_a_cause_still_hides_the_spike_it_explains(am):
    """A regression or a host stall hides its own job's spike, not another job's, and the
    regression itself pages."""
    scenario = Scenario(am)
    regressed, stalled, other = scenario.job("a"), scenario.job("b"), scenario.job("c")
    page = alert("ArgusIterationRegression", regressed)
    spikes = {job: alert("ArgusIterationSpike", job) for job in (regressed, stalled, other)}
    am.post([page, alert("ArgusHostStall", stalled), *spikes.values()])
    status = scenario.status()
    assert _page_reaches_someone(status[_key(page)])
    assert status[_key(spikes[regressed])]["inhibitedBy"]
    assert status[_key(spikes[stalled])]["inhibitedBy"]
    assert _page_reaches_someone(status[_key(spikes[other])])


def test_a_silenced_source_still_inhibits_its_tickets(am):
    """What the runbook warns of: Alertmanager lets a silenced regression inhibit the job's
    spikes (tickets). If this ever fails, Alertmanager changed and the runbook can say less."""
    scenario = Scenario(am)
    job = scenario.job("d")
    source, spike = alert("ArgusIterationRegression", job), alert("ArgusIterationSpike", job)
    am.post([source])
    scenario.silence(source)
    am.post([spike])
    assert scenario.status()[_key(spike)]["inhibitedBy"]
