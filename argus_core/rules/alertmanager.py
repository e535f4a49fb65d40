"""The Alertmanager example: routes by ``level`` and ``severity``, one group per training job,
inhibition so that one incident pages once, webhook receivers.

Inhibition (argued in the README's runbook): a rank-level cause (ArgusStragglerRank,
ArgusLinkDegraded, ArgusKernelStraggler, ArgusHostStall) for a job silences that job's
iteration-time symptoms (ArgusIterationSpike, ArgusIterationRegression): the cause says what
the symptom says and also where to look. A regression silences the job's spikes: while the
pace shifts, "one slow step" is the same news.
"""

from __future__ import annotations

from argus_core.rules.alerts import L1_SYMPTOMS, RANK_CAUSES
from argus_core.rules.config import RulesConfig, format_duration

RECEIVERS = ("argus-default", "argus-page", "argus-ticket", "argus-pipeline")


def alertmanager_config(config: RulesConfig) -> dict:
    """alertmanager.yml as a dict; every receiver posts to ``config.webhook_url``."""
    def webhook(name: str) -> dict:
        return {"name": name, "webhook_configs": [{"url": config.webhook_url,
                                                   "send_resolved": True}]}

    return {
        "route": {
            "receiver": "argus-default",
            "group_by": ["job"],
            "group_wait": format_duration(config.group_wait),
            "group_interval": format_duration(config.group_interval),
            "repeat_interval": format_duration(config.repeat_interval),
            "routes": [
                {"receiver": "argus-pipeline", "matchers": ['level="pipeline"'],
                 "group_by": ["alertname", "instance"]},
                {"receiver": "argus-page", "matchers": ['severity="critical"']},
                {"receiver": "argus-ticket", "matchers": ['severity="warning"']},
            ],
        },
        "inhibit_rules": [
            {"source_matchers": [f'alertname=~"{"|".join(RANK_CAUSES)}"'],
             "target_matchers": [f'alertname=~"{"|".join(L1_SYMPTOMS)}"'],
             "equal": ["job"]},
            {"source_matchers": ['alertname="ArgusIterationRegression"'],
             "target_matchers": ['alertname="ArgusIterationSpike"'],
             "equal": ["job"]},
        ],
        "receivers": [webhook(name) for name in RECEIVERS],
    }
