"""Configuration files of the local stack: the scrape config, the rules, alertmanager.yml.

The rules and the Alertmanager routing are the generated ones (``argus_core.rules``), run
``time_scale`` times faster. The scrape config is the same on either engine (Prometheus reads
it as prometheus.yml with the rule files and Alertmanager added; both vmagents read it as
vmagent.yml and split its targets between them): the exporters (file_sd, written by live jobs
and ``argus stack targets``), the processor and the scorer with ``honor_labels`` so that their
``job`` label (the training job) is kept rather than replaced by the scrape job's name, and the
engine's own components.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from argus_core.rules.alertmanager import alertmanager_config
from argus_core.rules.alerts import alert_groups
from argus_core.rules.config import (
    ACT_SCRAPE_JOB,
    EXPORTERS_SCRAPE_JOB,
    PROCESSOR_SCRAPE_JOB,
    SCORER_SCRAPE_JOB,
    RulesConfig,
    format_duration,
)
from argus_core.rules.generate import to_yaml
from argus_core.rules.recording import recording_groups


def _static(job: str, targets: list[str], interval: str, honor: bool = True) -> dict:
    config = {"job_name": job, "scrape_interval": interval,
              "static_configs": [{"targets": targets}]}
    if honor:
        config["honor_labels"] = True
    return config


def scrape_config(rules: RulesConfig, targets_dir: Path, processor: str, scorer: str,
                  own: dict[str, list[str]], file_sd_refresh: bool = True,
                  act: str | None = None) -> dict:
    """The scrape jobs of the stack (targets are host:port): Argus's, then ``own`` (scrape job
    name -> targets: the engine's components and Alertmanager, under their own job names) and
    ``argus act`` where given.
    ``file_sd_refresh``: say how often to reread the targets files (Prometheus; vmagent
    refuses the field and takes it as a flag)."""
    interval = format_duration(rules.scrape_interval)
    file_sd = {"files": [str(targets_dir / "*.json")]}
    if file_sd_refresh:
        file_sd["refresh_interval"] = interval
    exporters = {"job_name": EXPORTERS_SCRAPE_JOB, "honor_labels": True,
                 "scrape_interval": interval, "file_sd_configs": [file_sd]}
    return {
        "global": {"scrape_interval": interval,
                   "scrape_timeout": format_duration(min(rules.scrape_interval, 10.0))},
        "scrape_configs": [
            exporters,
            _static(PROCESSOR_SCRAPE_JOB, [processor], interval),
            _static(SCORER_SCRAPE_JOB, [scorer], interval),
            *([_static(ACT_SCRAPE_JOB, [act], interval)] if act else []),
            *(_static(job, targets, interval, honor=False) for job, targets in own.items()),
        ],
    }


def prometheus_config(scrape: dict, rules: RulesConfig, rule_files: list[str],
                      alertmanager: str) -> dict:
    """prometheus.yml: the scrape config, the rule files and where to send alerts."""
    config = {**scrape, "rule_files": rule_files,
              "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}}
    config["global"] = {**scrape["global"],
                        "evaluation_interval": format_duration(rules.evaluation_interval)}
    return config


def write_configs(directory: Path, rules: RulesConfig, webhook_url: str, processor: str,
                  scorer: str, alertmanager: str, own: dict[str, list[str]],
                  engine: str, act: str) -> dict[str, Path]:
    """Write the rules, the engine's scrape config (prometheus.yml or vmagent.yml) and
    alertmanager.yml under ``directory`` (``act``: the host:port of ``argus act``, scraped and
    sent ArgusSuspectUnit); returns their paths by kind."""
    rules_dir = directory / "rules"
    rules_dir.mkdir(parents=True, exist_ok=True)
    files = {"recording": rules_dir / "argus.rules.yml", "alerting": rules_dir / "argus.alerts.yml"}
    files["recording"].write_text(to_yaml({"groups": recording_groups(rules)}))
    files["alerting"].write_text(to_yaml({"groups": alert_groups(rules)}))
    targets = directory / "targets"
    targets.mkdir(exist_ok=True)
    scrape = scrape_config(rules, targets, processor, scorer,
                           {**own, "alertmanager": [alertmanager]},
                           file_sd_refresh=engine == "prometheus", act=act)
    if engine == "prometheus":
        files["scrape"] = directory / "prometheus.yml"
        scrape = prometheus_config(scrape, rules, [str(files["recording"]),
                                                   str(files["alerting"])], alertmanager)
    else:
        files["scrape"] = directory / "vmagent.yml"
    files["scrape"].write_text(to_yaml(scrape))
    files["alertmanager"] = directory / "alertmanager.yml"
    files["alertmanager"].write_text(to_yaml(alertmanager_config(
        replace(rules, webhook_url=webhook_url, act_url=f"http://{act}/webhook"))))
    files["targets"] = targets
    return files
