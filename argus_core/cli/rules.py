"""``argus rules``: generate the Prometheus rules, alerts, promtool tests and the Alertmanager
example from the defaults plus the user's overrides."""

from __future__ import annotations

import argparse
import sys


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser(
        "rules", help="generate recording/alerting rules, their tests and alertmanager.yml",
        description="Write recording_rules/ and alerting/ (rules, promtool tests, an "
                    "Alertmanager example) and argus.yml from the defaults overridden by "
                    "--config (`argus generate` also writes the dashboards). Load the rule "
                    "files into Prometheus or a Mimir/Thanos ruler; never edit them by hand.")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    p.add_argument("--config", metavar="FILE", help="YAML file of settings to override")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="K",
                   help="divide every duration by K (tests and local demos; default 1)")
    p.set_defaults(run=run)


def load(path: str | None, time_scale: float, command: str):
    """The RulesConfig of ``--config`` (defaults without one) run ``--time-scale`` times
    faster, or None after printing what is wrong with it."""
    from argus_core.rules.config import load_config

    try:
        config = load_config(path)
        return config.scaled(time_scale) if time_scale != 1.0 else config
    except (OSError, ValueError) as exc:
        print(f"argus {command}: error: {exc}", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    from argus_core.rules.generate import write_all

    config = load(args.config, args.time_scale, "rules")
    if config is None:
        return 2
    for path in write_all(config, args.out):
        print(path)
    return 0
