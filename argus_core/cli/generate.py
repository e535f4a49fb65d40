"""``argus generate``: every generated file from one config. Under ``--out``: the recording
rules, alerts, Alertmanager routing and promtool tests (``recording_rules/``, ``alerting/``),
``argus.yml`` (every setting with its default) and the Grafana dashboards with their
provisioning file (``grafana/``), so the rules and the dashboards agree on every setting.
``--out .`` in a checkout regenerates the committed copies (``make generate``)."""

from __future__ import annotations

import argparse
from pathlib import Path

GRAFANA_DIR = "grafana"


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser(
        "generate", help="write the rules, alerts, routing, their tests and the dashboards "
                         "from one config",
        description="Write every generated file from one config (the defaults overridden by "
                    "--config; argus.yml lists every setting): the recording rules, alerts, "
                    "Alertmanager routing and promtool tests under DIR/recording_rules and "
                    "DIR/alerting, argus.yml, and the Grafana dashboards with their "
                    "provisioning file under DIR/grafana. Rules and dashboards then agree on "
                    "every setting; never edit the generated files.")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    p.add_argument("--config", metavar="FILE",
                   help="YAML file of settings to override (the keys of argus.yml)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="K",
                   help="divide every duration by K (tests and local demos; default 1)")
    p.add_argument("--provider-path", metavar="PATH",
                   help="where Grafana will read the dashboards' JSON (the provisioning "
                        "file's options.path; default /var/lib/grafana/dashboards/argus)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the rules' files, then the dashboards, for one config."""
    from argus_core.cli.dashboards import write
    from argus_core.cli.rules import load
    from argus_core.rules.generate import write_all

    config = load(args.config, args.time_scale, "generate")
    if config is None:
        return 2
    dashboards = write(str(Path(args.out) / GRAFANA_DIR), args.provider_path, config,
                       "generate")
    if dashboards is None:
        return 1
    for path in [*write_all(config, args.out), *dashboards]:
        print(path)
    return 0
