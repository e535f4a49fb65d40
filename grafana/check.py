"""Run every query of the dashboards against a Prometheus, the way Grafana would, and report.

Each variable is resolved first (label values through the HTTP API, custom ones from their
options; a multi-value variable takes All, as a regex of every value), then every panel query,
annotation and variable query is run with the variables substituted: panel queries as range
queries over the dashboard range (instant for tables and stats), annotations as range queries.
A query passes when it returns at least one finite value (a marker query, ``ratio >= 1.5``
or ``ratio >= on (job) threshold``, also when none passes its threshold but the ratio itself
has values). A query that reads a
component this Prometheus has no series of at all (the recording rules, the scorer, live
alert evaluation, scrape series) is *skipped* with that reason instead of failing, so one run
says both what works and what could not be checked here.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from argus_core.timeparse import parse_duration
from argus_grafana import generate
from argus_grafana import queries as q
from argus_grafana.prometheus import PrometheusError, api

SKIP_REASONS = {
    q.RULES: "needs the Argus recording rules (recording_rules/) in this Prometheus",
    q.ALERTS: "needs the Argus alert rules evaluated live (Prometheus writes ALERTS only "
              "while it evaluates them; a backfilled history cannot hold them)",
    q.SCORER: "needs the W1 scoring job (`argus score`) scraped by this Prometheus",
    q.PROMETHEUS: "needs series Prometheus writes when it scrapes (up, scrape_duration_seconds, "
                  "process_*); a backfilled history has none",
    q.EXPORTER: "needs the exporters' metrics in this Prometheus",
    q.PROCESSOR: "needs the processor's metrics in this Prometheus",
    q.ACT: "needs the remediation planner (`argus act`) scraped by this Prometheus",
}
POINTS = 120  # data points per range query (Grafana's maxDataPoints order of magnitude)


class CheckError(Exception):
    """The check cannot run (Prometheus unreachable, no job to substitute)."""


@dataclass
class Outcome:
    """One query's result."""

    dashboard: str
    where: str  # panel title [refId], "variable x" or "annotation y"
    expr: str  # as sent, variables substituted
    status: str  # ok, empty, error, skipped
    detail: str = ""

    def line(self) -> str:
        """One line for people."""
        return f"{self.status.upper():7} {self.dashboard} / {self.where}: {self.detail}"


@dataclass
class Report:
    """Every query's outcome."""

    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no query failed or came back empty (skipped ones do not count)."""
        return not self.failed

    @property
    def failed(self) -> list[Outcome]:
        """Queries that errored or returned no data although their sources are present."""
        return [o for o in self.outcomes if o.status in ("empty", "error")]

    @property
    def skipped(self) -> list[Outcome]:
        """Queries not checked, with the reason."""
        return [o for o in self.outcomes if o.status == "skipped"]

    def text(self) -> str:
        """The report: failures first, then skips, then a count."""
        order = {"error": 0, "empty": 1, "skipped": 2, "ok": 3}
        lines = [o.line() for o in sorted(self.outcomes, key=lambda o: order[o.status])]
        counts = {s: sum(o.status == s for o in self.outcomes) for s in order}
        lines.append(f"{counts['ok']} ok, {counts['skipped']} skipped, "
                     f"{counts['empty']} empty, {counts['error']} errors")
        return "\n".join(lines)


# -- substitution ------------------------------------------------------------------------------
_VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]+)(?::([a-z]+))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_THRESHOLD = re.compile(r"(.*\S)\s*(?:>=|>|<=|<|==)\s*"
                        r"(?:[0-9.]+|on \([\w, ]*\) [A-Za-z_:][\w:]*(?:\{[^{}]*\})?)")
_REGEX_SPECIAL = re.compile(r"([\\.^$*+?()\[\]{}|])")


def substitute(expr: str, values: dict[str, list[str]]) -> str:
    """``expr`` with Grafana's variables replaced: one value as is, several as ``(a|b)`` with
    regex characters escaped (what the Prometheus data source sends)."""
    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        if name not in values:
            return match.group(0)
        chosen = values[name]
        if len(chosen) == 1:
            return chosen[0]
        return "(" + "|".join(_REGEX_SPECIAL.sub(r"\\\1", v) for v in chosen) + ")"
    return _VAR.sub(replace, expr)


def _duration_s(text: str) -> float:
    """Seconds of a Prometheus duration; CheckError naming the text otherwise."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise CheckError(str(exc)) from None


# -- the check ---------------------------------------------------------------------------------
def present_sources(url: str, start_s: float, end_s: float) -> set[str]:
    """The components this Prometheus holds any series of between start and end."""
    present = set()
    for source in SKIP_REASONS:
        names = [n for n, s in q.METRICS.items() if s == source]
        if not names:
            continue
        found = api(url, "/api/v1/series", {
            "match[]": "{__name__=~\"" + "|".join(map(re.escape, names)) + "\"}",
            "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "limit": "1"})
        if found:
            present.add(source)
    return present


def check_all(url: str, *, job: str | None = None, at: float | None = None,
              rate_interval: str = "1m", range_: str = "1h",
              values: dict[str, str] | None = None, boards: dict | None = None) -> Report:
    """Check every dashboard's queries against the Prometheus at ``url``.

    ``at`` is the evaluation time (default now), ``range_`` the dashboard range ending there,
    ``values`` fixes variables (``{"axis": "tp", "rank": "5"}``); ``boards`` (uid -> JSON)
    defaults to the generated dashboards."""
    end_s = time.time() if at is None else at
    start_s = end_s - _duration_s(range_)
    _duration_s(rate_interval)
    try:
        present = present_sources(url, start_s, end_s)
    except PrometheusError as exc:
        raise CheckError(str(exc)) from None
    if boards is None:
        boards = {uid: json.loads(generate.encode(build()))
                  for uid, build in generate.BUILDERS.items()}
    report = Report()
    for uid, board in boards.items():
        context = _Context(url, start_s, end_s, present, report, uid)
        resolved = context.variables(board, job, values or {})
        resolved["__rate_interval"] = [rate_interval]
        resolved["__range"] = [f"{int(end_s - start_s)}s"]
        for annotation in board.get("annotations", {}).get("list", ()):
            if annotation.get("expr"):
                context.run(f"annotation {annotation['name']!r}", annotation["expr"],
                            resolved, instant=False)
        for panel in board.get("panels", ()):
            for target in panel.get("targets", ()):
                context.run(f"{panel['title']} [{target['refId']}]", target["expr"], resolved,
                            instant=bool(target.get("instant")) and not target.get("range"))
    return report


@dataclass
class _Context:
    url: str
    start_s: float
    end_s: float
    present: set[str]
    report: Report
    dashboard: str

    def variables(self, board: dict, job: str | None, fixed: dict[str, str]) -> dict:
        resolved: dict[str, list[str]] = {}
        for variable in board.get("templating", {}).get("list", ()):
            name, kind = variable["name"], variable["type"]
            if kind == "datasource":
                continue
            if name in fixed:
                resolved[name] = [fixed[name]]
                continue
            if kind == "custom":
                current = variable.get("current") or {}
                resolved[name] = [current.get("value") or variable["options"][0]["value"]]
                continue
            if kind == "textbox":
                resolved[name] = [variable.get("query", "")]
                continue
            found = self.label_values(f"variable {name}", variable["query"], resolved)
            if name == "job" and job is not None:
                if found and job not in found:
                    raise CheckError(f"job {job!r} is not in Prometheus (jobs: "
                                     f"{', '.join(found)})")
                found = [job]
            if not found:
                raise CheckError(f"{self.dashboard}: variable {name} has no values, so the "
                                 "queries that use it cannot be checked")
            resolved[name] = found if variable.get("includeAll") else found[:1]
        return resolved

    def label_values(self, where: str, query: str, resolved: dict) -> list[str]:
        match = re.fullmatch(r"label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)", query.strip())
        if match is None:
            raise CheckError(f"{where}: only label_values(selector, label) is supported")
        selector = substitute(match.group(1), resolved)
        missing = q.sources(selector) - self.present
        if missing:
            self.report.outcomes.append(Outcome(self.dashboard, where, query, "skipped",
                                                SKIP_REASONS[sorted(missing)[0]]))
            return []
        try:
            found = api(self.url, f"/api/v1/label/{match.group(2)}/values",
                        {"match[]": selector, "start": f"{self.start_s:.3f}",
                         "end": f"{self.end_s:.3f}"})
        except PrometheusError as exc:
            self.report.outcomes.append(Outcome(self.dashboard, where, selector, "error",
                                                str(exc)))
            return []
        values = sorted(found, key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v))
        self.report.outcomes.append(Outcome(
            self.dashboard, where, selector, "ok" if values else "empty",
            f"{len(values)} values" if values else "no values"))
        return values

    def run(self, where: str, expr: str, resolved: dict, instant: bool) -> None:
        sent = substitute(expr, resolved)
        missing = q.sources(expr) - self.present
        if missing:
            self.report.outcomes.append(Outcome(self.dashboard, where, sent, "skipped",
                                                SKIP_REASONS[sorted(missing)[0]]))
            return
        try:
            if instant:
                data = api(self.url, "/api/v1/query", {"query": sent,
                                                       "time": f"{self.end_s:.3f}"})
                values = [float(item["value"][1]) for item in data["result"]]
            else:
                step = max(15.0, (self.end_s - self.start_s) / POINTS)
                data = api(self.url, "/api/v1/query_range", {
                    "query": sent, "start": f"{self.start_s:.3f}", "end": f"{self.end_s:.3f}",
                    "step": f"{step:g}"})
                values = [float(v) for item in data["result"] for _, v in item["values"]]
        except PrometheusError as exc:
            self.report.outcomes.append(Outcome(self.dashboard, where, sent, "error", str(exc)))
            return
        finite = [v for v in values if math.isfinite(v)]
        series = len(data["result"])
        threshold = _THRESHOLD.fullmatch(expr.strip())
        if not finite and threshold and not where.startswith("base of"):
            # markers (``ratio >= 1.5``): none in range is an answer if the ratio itself is there
            before = len(self.report.outcomes)
            self.run(f"base of {where}", threshold.group(1), resolved, instant)
            base = self.report.outcomes.pop(before)
            if base.status == "ok":
                self.report.outcomes.append(Outcome(
                    self.dashboard, where, sent, "ok",
                    f"no point past the threshold in range; the series it filters has "
                    f"{base.detail}"))
                return
        status = "ok" if finite else "empty"
        detail = (f"{series} series, {len(finite)} values" if finite else
                  f"no finite value ({series} series, {len(values)} values)")
        self.report.outcomes.append(Outcome(self.dashboard, where, sent, status, detail))


def rule_files(root: Path) -> list[Path]:
    """The recording-rule files of a checkout (``recording_rules/*.yml``), if any."""
    directory = root / "recording_rules"
    return sorted(directory.glob("*.yml")) \
        if directory.is_dir() else []


def backfill_rule_files(root: Path, workdir: Path) -> list[Path]:
    """The recording rules to backfill over a replayed history, written into ``workdir``: the
    checkout's rules generated with ``l2_source: promql``, since no scorer runs over a
    backfilled history (the default ``scorer`` mode would leave the L2 panels without data).
    Empty when the checkout has no recording rules."""
    if not rule_files(root):
        return []
    from argus_core.rules.config import L2_PROMQL, RulesConfig
    from argus_core.rules.generate import RULES_FILE, rendered

    path = Path(workdir) / "argus.rules.yml"
    path.write_text(rendered(RulesConfig(l2_source=L2_PROMQL))[RULES_FILE])
    return [path]
