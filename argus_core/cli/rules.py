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
                    "Alertmanager example) from the defaults (recording_rules/defaults.yml) "
                    "overridden by --config. Load the rule files into Prometheus or a "
                    "Mimir/Thanos ruler; never edit them by hand.")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    p.add_argument("--config", metavar="FILE", help="YAML file of settings to override")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="K",
                   help="divide every duration by K (tests and local demos; default 1)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    from argus_core.rules.config import load_config
    from argus_core.rules.generate import write_all

    try:
        config = load_config(args.config)
        if args.time_scale != 1.0:
            config = config.scaled(args.time_scale)
    except (OSError, ValueError) as exc:
        print(f"argus rules: error: {exc}", file=sys.stderr)
        return 2
    paths = write_all(config, args.out)
    for path in paths:
        print(path)
    return 0
