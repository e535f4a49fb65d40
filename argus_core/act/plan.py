"""The remediation plan: sustained hardware suspects (ArgusSuspectUnit alerts) turned into
drain or cordon commands an operator can trust.

- **Hysteresis**: a unit is acted on only once its alert has fired without a break for
  ``hold_s`` (Alertmanager's ``startsAt``: an alert that resolves and fires again starts
  over), so a flapping verdict never drains anything.
- **Budget**: at most ``budget`` nodes drained (or planned, in a dry run) in any
  ``budget_window_s``; a unit past the budget waits, refused, until the window frees a place.
- **Never the last healthy node**: where the job's hosts are known (``job_hosts``), a node
  whose drain would leave the job no other node that is not drained is refused.
- **Dry run by default**: the plan says what would run; commands run only with ``execute``,
  as an argument vector built from the operator's template (never through a shell).

Units inside a host (a GPU, NIC, PCIe switch, the host itself) drain their host; network units
(rack, leaf, spine switch) get a ticket: no command drains a switch. Every decision is one
line of the audit log.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from argus_core.timeparse import parse_instant

ALERT = "ArgusSuspectUnit"
HOST_UNITS = frozenset({"gpu", "nic", "pcie_switch", "host"})
"""Units inside a host: acted on by draining the host."""
TEMPLATES = {
    "kubernetes": "kubectl cordon {node}",
    "slurm": "scontrol update NodeName={node} State=DRAIN Reason={reason}",
}
"""Command templates per scheduler (``--command`` gives any other)."""
PLACEHOLDERS = ("node", "unit", "unit_kind", "job", "cause", "reason")
STATES = ("holding", "planned", "executed", "failed", "refused_budget", "refused_last_node",
          "ticket", "resolved")
MAX_UNITS = 10_000
"""Units the plan holds at most: past it the oldest resolved (then settled) ones are forgotten."""
MAX_LABEL = 256
"""Longest job, unit_kind, unit or cause label taken (hosts: 16 times that)."""


@dataclass(frozen=True)
class ActConfig:
    """How sustained suspects become actions."""

    hold_s: float = 600.0
    budget: int = 2  # nodes a window
    budget_window_s: float = 3600.0
    command: str = TEMPLATES["kubernetes"]
    execute: bool = False
    timeout_s: float = 60.0  # one command's run

    def __post_init__(self) -> None:
        if self.hold_s < 0 or self.budget < 0 or self.budget_window_s <= 0:
            raise ValueError("hold and budget must be >= 0 and the budget window > 0")
        argv = shlex.split(self.command)
        if not argv:
            raise ValueError("the command template is empty")
        for part in argv:
            try:
                part.format(**dict.fromkeys(PLACEHOLDERS, ""))
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"command template part {part!r}: unknown placeholder "
                                 f"{exc} (known: {', '.join(PLACEHOLDERS)})") from None


@dataclass
class Step:
    """What the plan does about one suspect unit."""

    job: str
    unit_kind: str
    unit: str
    cause: str
    hosts: tuple[str, ...]
    started: float  # when its alert started firing (unix seconds)
    state: str = "holding"
    node: str = ""  # the node drained (host units)
    argv: tuple[str, ...] = ()
    detail: str = ""
    decided: float | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        """The alert's identity."""
        return (self.job, self.unit_kind, self.unit, self.cause)


@dataclass
class Planner:
    """The plan, fed Alertmanager's notifications and re-evaluated by ``tick``."""

    config: ActConfig = field(default_factory=ActConfig)
    audit: Path | None = None
    job_hosts: Callable[[str], set[str] | None] | None = None
    clock: Callable[[], float] = time.time
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run
    steps: dict[tuple[str, str, str, str], Step] = field(default_factory=dict)
    drains: list[tuple[float, str]] = field(default_factory=list)  # (when, node), in order
    decisions: dict[str, int] = field(default_factory=dict)  # state -> count

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def notify(self, payload: dict) -> None:
        """Take in one Alertmanager webhook payload; raises ValueError naming what is wrong."""
        alerts = payload.get("alerts") if isinstance(payload, dict) else None
        if not isinstance(alerts, list):
            raise ValueError("expected an Alertmanager webhook payload with an 'alerts' list")
        taken = [parsed for parsed in map(_parse, alerts) if parsed is not None]  # all or none
        with self._lock:
            for key, started, hosts, resolved in taken:
                self._take(key, started, hosts, resolved)
            self._decide()

    def tick(self) -> None:
        """Re-evaluate held and refused units (a hold runs out between notifications)."""
        with self._lock:
            self._decide()

    def plan(self) -> list[dict]:
        """The current plan, one entry per unit."""
        with self._lock:
            return [{**asdict(s), "argv": list(s.argv), "hosts": list(s.hosts)}
                    for s in self.steps.values()]

    def _take(self, key: tuple[str, str, str, str], started: float, hosts: tuple[str, ...],
              resolved: bool) -> None:
        step = self.steps.get(key)
        if resolved:
            if step is not None and step.state != "resolved":
                self._move(step, "resolved", "the alert resolved")
            return
        if step is None or step.state == "resolved" or step.started != started:
            if step is not None and step.state in ("planned", "executed"):
                return  # acted on already: a re-fire does not act twice
            if step is None and len(self.steps) >= MAX_UNITS:
                self._forget_one()
            self.steps[key] = Step(*key, hosts=hosts, started=started)
            self._audit(self.steps[key], "holding", "first seen")

    def _forget_one(self) -> None:
        """Make room for one unit: forget the longest-resolved one, else the oldest unit not
        acted on (it starts its hold again if its alert comes back); acted-on units stay."""
        for states in (("resolved",), ("ticket", "failed", "holding", "refused_budget",
                                       "refused_last_node")):
            old = [s for s in self.steps.values() if s.state in states]
            if old:
                oldest = min(old, key=lambda s: (s.decided or s.started, s.started))
                del self.steps[oldest.key]
                return
        raise ValueError(f"the plan holds {MAX_UNITS} units acted on: none can be forgotten")

    def _decide(self) -> None:
        now = self.clock()
        for step in self.steps.values():
            if step.state not in ("holding", "refused_budget", "refused_last_node"):
                continue
            if now - step.started < self.config.hold_s:
                continue
            if step.unit_kind not in HOST_UNITS:
                self._move(step, "ticket", f"{step.unit_kind} {step.unit}: no command drains "
                           f"a switch; hosts under it: {', '.join(step.hosts) or 'unknown'}")
                continue
            node = _node(step)
            if not node:
                self._move(step, "failed", "no host known for the unit")
                continue
            step.node = node
            recent = [n for t, n in self.drains if now - t < self.config.budget_window_s]
            if node in recent or node in {s.node for s in self.steps.values()
                                          if s is not step and s.state in ("planned",
                                                                           "executed")}:
                self._move(step, "planned" if not self.config.execute else "executed",
                           f"node {node} is already drained")
                continue
            if len(recent) >= self.config.budget:
                if step.state != "refused_budget":
                    self._move(step, "refused_budget", f"{len(recent)} nodes drained in the "
                               f"last {self.config.budget_window_s:g} s (budget "
                               f"{self.config.budget})")
                continue
            hosts = self.job_hosts(step.job) if self.job_hosts else None
            drained = {n for _, n in self.drains}
            if hosts is not None and not (hosts - drained - {node}):
                if step.state != "refused_last_node":
                    self._move(step, "refused_last_node", f"node {node} is the last node of "
                               f"job {step.job} not drained")
                continue
            self._act(step, node, now)

    def _act(self, step: Step, node: str, now: float) -> None:
        reason = f"argus: {step.unit_kind} {step.unit} ({step.cause}, job {step.job})"
        values = {"node": node, "unit": step.unit, "unit_kind": step.unit_kind,
                  "job": step.job, "cause": step.cause, "reason": reason}
        step.argv = tuple(part.format(**values) for part in shlex.split(self.config.command))
        self.drains.append((now, node))
        del self.drains[:-MAX_UNITS]  # the oldest drains go first (at most a budget an hour)
        if not self.config.execute:
            self._move(step, "planned", "dry run: " + shlex.join(step.argv))
            return
        try:
            done = self.run(list(step.argv), capture_output=True, text=True, shell=False,
                            timeout=self.config.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._move(step, "failed", f"{shlex.join(step.argv)}: {exc}")
            return
        if done.returncode != 0:
            self._move(step, "failed", f"{shlex.join(step.argv)}: exit {done.returncode}: "
                       f"{(done.stderr or '').strip()[:500]}")
            return
        self._move(step, "executed", shlex.join(step.argv))

    def _move(self, step: Step, state: str, detail: str) -> None:
        step.state, step.detail, step.decided = state, detail, self.clock()
        self._audit(step, state, detail)

    def _audit(self, step: Step, state: str, detail: str) -> None:
        self.decisions[state] = self.decisions.get(state, 0) + 1
        if self.audit is None:
            return
        line = {"at": self.clock(), "state": state, "job": step.job,
                "unit_kind": step.unit_kind, "unit": step.unit, "cause": step.cause,
                "node": step.node, "argv": list(step.argv), "detail": detail}
        with self.audit.open("a") as f:
            f.write(json.dumps(line) + "\n")


def _parse(alert) -> tuple[tuple[str, str, str, str], float, tuple[str, ...], bool] | None:
    """An ArgusSuspectUnit alert's (key, startsAt, hosts, resolved); None for another alert;
    ValueError naming what is wrong."""
    labels = alert.get("labels") if isinstance(alert, dict) else None
    if not isinstance(labels, dict) or labels.get("alertname") != ALERT:
        return None
    key = []
    for name in ("job", "unit_kind", "unit", "cause"):
        if name not in labels:
            raise ValueError(f"{ALERT} without the label {name!r}")
        value = str(labels[name])
        if len(value) > MAX_LABEL:
            raise ValueError(f"{ALERT}: label {name!r} longer than {MAX_LABEL} characters")
        key.append(value)
    text = str(labels.get("hosts", ""))
    if len(text) > 16 * MAX_LABEL:
        raise ValueError(f"{ALERT}: label 'hosts' longer than {16 * MAX_LABEL} characters")
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    resolved = alert.get("status") == "resolved"
    started = 0.0 if resolved else _instant(alert.get("startsAt"))
    return (key[0], key[1], key[2], key[3]), started, hosts, resolved


def _node(step: Step) -> str:
    """The host a unit inside a host sits in: the host's own name, the part of a NIC's or
    PCIe switch's name before '/', else the one host its alert names."""
    if step.unit_kind == "host":
        return step.unit
    host, sep, _ = step.unit.partition("/")
    if sep and step.unit_kind in ("nic", "pcie_switch"):
        return host
    return step.hosts[0] if len(step.hosts) == 1 else ""


def _instant(text) -> float:
    """Alertmanager's RFC 3339 ``startsAt`` as unix seconds."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"{ALERT}: startsAt missing or not a string: {text!r:.40}")
    try:
        return parse_instant(text) / 1e9
    except ValueError as exc:
        raise ValueError(f"{ALERT}: startsAt {text!r:.40}: {exc}") from None
