"""Configuration files of the local stack: prometheus.yml, the rules, alertmanager.yml.

The rules and the Alertmanager routing are the generated ones (``argus_core.rules``), run
``time_scale`` times faster; Prometheus scrapes the exporters (file_sd, written by the live
jobs), the processor and the scorer with ``honor_labels`` so that their ``job`` label (the
training job) is kept rather than replaced by the scrape job's name.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from argus_core.rules.alertmanager import alertmanager_config
from argus_core.rules.alerts import alert_groups
from argus_core.rules.config import (
    EXPORTERS_SCRAPE_JOB,
    PROCESSOR_SCRAPE_JOB,
    SCORER_SCRAPE_JOB,
    RulesConfig,
    format_duration,
)
from argus_core.rules.generate import to_yaml
from argus_core.rules.recording import recording_groups


def _static(job: str, target: str, interval: str, honor: bool = True) -> dict:
    config = {"job_name": job, "scrape_interval": interval,
              "static_configs": [{"targets": [target]}]}
    if honor:
        config["honor_labels"] = True
    return config


def prometheus_config(rules: RulesConfig, targets_dir: Path, rule_files: list[str],
                      processor: str, scorer: str, alertmanager: str, self_target: str) -> dict:
    """prometheus.yml for the stack (targets are host:port)."""
    interval = format_duration(rules.scrape_interval)
    exporters = {
        "job_name": EXPORTERS_SCRAPE_JOB, "honor_labels": True, "scrape_interval": interval,
        "file_sd_configs": [{"files": [str(targets_dir / "*.json")],
                             "refresh_interval": interval}],
    }
    return {
        "global": {"scrape_interval": interval,
                   "evaluation_interval": format_duration(rules.evaluation_interval),
                   "scrape_timeout": format_duration(min(rules.scrape_interval, 10.0))},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            exporters,
            _static(PROCESSOR_SCRAPE_JOB, processor, interval),
            _static(SCORER_SCRAPE_JOB, scorer, interval),
            _static("prometheus", self_target, interval, honor=False),
            _static("alertmanager", alertmanager, interval, honor=False),
        ],
    }


def write_configs(directory: Path, rules: RulesConfig, webhook_url: str, processor: str,
                  scorer: str, alertmanager: str, prometheus: str) -> dict[str, Path]:
    """Write rules, prometheus.yml and alertmanager.yml under ``directory``."""
    rules_dir = directory / "rules"
    rules_dir.mkdir(parents=True, exist_ok=True)
    files = {"recording": rules_dir / "argus.rules.yml", "alerting": rules_dir / "argus.alerts.yml"}
    files["recording"].write_text(to_yaml({"groups": recording_groups(rules)}))
    files["alerting"].write_text(to_yaml({"groups": alert_groups(rules)}))
    targets = directory / "targets"
    targets.mkdir(exist_ok=True)
    files["prometheus"] = directory / "prometheus.yml"
    files["prometheus"].write_text(to_yaml(prometheus_config(
        rules, targets, [str(files["recording"]), str(files["alerting"])], processor, scorer,
        alertmanager, prometheus)))
    files["alertmanager"] = directory / "alertmanager.yml"
    files["alertmanager"].write_text(to_yaml(alertmanager_config(
        replace(rules, webhook_url=webhook_url))))
    files["targets"] = targets
    return files
