"""The Alertmanager example: routes by ``level`` and ``severity``, one group per training job,
inhibition that cannot hide an incident, webhook receivers, and ArgusSuspectUnit also sent
to ``argus act``.

Inhibition (argued in docs/runbook.md) hides a target only where its source explains it
by construction (``INHIBITIONS``), and each rule is built so that it cannot hide an incident:

- the target is a ticket (``severity="warning"``), never a page. The page a symptom raises
  (ArgusIterationRegression) names only its job, so no label can show that a rank-level cause
  explains it: a second slowdown of the job would be hidden with the first. Grouping by job
  already brings a cause and its symptom in one notification.
- the source is at least as severe as the target, so a ticket never hides a page.
- ``equal`` holds every label that places the target (``LOCATION``), and each of them must be
  non-empty on both sides: Alertmanager takes a missing label for an empty one, so two alerts
  without a ``job`` would otherwise inhibit each other.

What no rule can prevent: Alertmanager lets a silenced alert inhibit as if it were not
silenced. A silence can therefore hide the tickets its alert inhibits, never a page.
"""

from __future__ import annotations

from argus_core.rules.alerts import LOCATION, alert_groups
from argus_core.rules.config import RulesConfig, format_duration

RECEIVERS = ("argus-default", "argus-page", "argus-ticket", "argus-pipeline")
ACT_RECEIVER = "argus-act"  # `argus act`: ArgusSuspectUnit becomes a drain or ticket plan
ACT_ALERT = "ArgusSuspectUnit"
SEVERITIES = ("warning", "critical")  # least severe first
PAGE = "critical"

# (sources, target): the sources explain the target whenever both fire for the same place.
INHIBITIONS = (
    # While the job's pace has shifted, one slow step is the same news; the regression pages.
    (("ArgusIterationRegression",), "ArgusIterationSpike"),
    # A host stall fires only when its job showed a spike within its host window, and explains
    # at least `attribution_share` of it: the spike's cause, with the rank named.
    (("ArgusHostStall",), "ArgusIterationSpike"),
)


def alertmanager_config(config: RulesConfig) -> dict:
    """alertmanager.yml as a dict: every receiver posts to ``config.webhook_url``, and
    ArgusSuspectUnit also to ``config.act_url`` (when set)."""
    def webhook(name: str, url: str = config.webhook_url) -> dict:
        return {"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]}

    # ArgusSuspectUnit also reaches `argus act` (one group per unit, so that each unit's hold
    # starts with its own alert), then goes on to the routes below like every alert.
    act = ([{"receiver": ACT_RECEIVER, "matchers": [f'alertname="{ACT_ALERT}"'],
             "group_by": ["alertname", "job", "unit_kind", "unit"], "continue": True}]
           if config.act_url else [])

    severity = {rule["alert"]: rule["labels"]["severity"]
                for group in alert_groups(config) for rule in group["rules"]}
    return {
        "route": {
            "receiver": "argus-default",
            "group_by": ["job"],
            "group_wait": format_duration(config.group_wait),
            "group_interval": format_duration(config.group_interval),
            "repeat_interval": format_duration(config.repeat_interval),
            "routes": [
                *act,
                {"receiver": "argus-pipeline", "matchers": ['level="pipeline"'],
                 "group_by": ["alertname", "instance"]},
                {"receiver": "argus-page", "matchers": [f'severity="{PAGE}"']},
                {"receiver": "argus-ticket", "matchers": ['severity="warning"']},
            ],
        },
        "inhibit_rules": [inhibit_rule(sources, target, severity)
                          for sources, target in INHIBITIONS],
        "receivers": [webhook(name) for name in RECEIVERS]
        + ([webhook(ACT_RECEIVER, config.act_url)] if config.act_url else []),
    }


def inhibit_rule(sources: tuple[str, ...], target: str, severity: dict[str, str]) -> dict:
    """One inhibit rule: ``sources`` (at least as severe as ``target``) hide ``target`` where
    every label that places ``target`` is equal and non-empty; ``severity`` maps each alert
    name to its severity. Raises ValueError for a rule that could hide a page, or whose
    sources do not name every label that places the target."""
    level = severity[target]
    if level == PAGE:
        raise ValueError(f"{target} pages: a page is never inhibited")
    place = LOCATION[target]
    for source in sources:
        if SEVERITIES.index(severity[source]) < SEVERITIES.index(level):
            raise ValueError(f"{source} ({severity[source]}) cannot hide {target} ({level})")
        if not set(place) <= set(LOCATION[source]):
            raise ValueError(f"{source} does not name every label of {target}: {place}")
    present = [f'{label}!=""' for label in place]
    at_least = "|".join(SEVERITIES[SEVERITIES.index(level):])
    names = (f'alertname="{sources[0]}"' if len(sources) == 1
             else f'alertname=~"{"|".join(sources)}"')
    return {"source_matchers": [names,
                                f'severity=~"{at_least}"', *present],
            "target_matchers": [f'alertname="{target}"', f'severity="{level}"', *present],
            "equal": list(place)}
