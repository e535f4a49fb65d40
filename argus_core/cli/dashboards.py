"""``argus dashboards``: write the Grafana dashboards (JSON) and their provisioning file.

``--out DIR`` writes ``DIR/dashboards/*.json`` and ``DIR/provisioning/dashboards/argus.yaml``
(``--out grafana`` in a checkout regenerates the committed copies). ``--check URL`` instead runs
every panel and variable query against a Prometheus and says which return no data.
"""

from __future__ import annotations

import argparse
import sys


def register(commands) -> None:
    """Add the ``dashboards`` subcommand to the CLI."""
    p = commands.add_parser("dashboards", help="write the Grafana dashboards (or check them "
                                               "against a Prometheus)",
                            description=__doc__.splitlines()[0])
    p.add_argument("--out", metavar="DIR", help="directory to write dashboards/ and "
                                                 "provisioning/ into")
    p.add_argument("--config", metavar="FILE",
                   help="YAML file of settings to override (argus.yml's keys): the dashboards "
                        "show its thresholds and query with its selectors")
    p.add_argument("--provider-path", metavar="PATH",
                   help="where Grafana will read the JSON files (the provisioning file's "
                        "options.path; default /var/lib/grafana/dashboards/argus)")
    p.add_argument("--check", metavar="URL",
                   help="run every query against this Prometheus instead (http://host:9090)")
    p.add_argument("--job", help="with --check: the job to substitute for $job "
                                 "(default: the first one Prometheus knows)")
    p.add_argument("--rate-interval", default="1m", metavar="D",
                   help="with --check: value of $__rate_interval (default 1m)")
    p.add_argument("--range", default="1h", metavar="D",
                   help="with --check: value of $__range and the range queried (default 1h)")
    p.add_argument("--at", metavar="T", help="with --check: end of the range, ISO-8601 or Unix "
                                             "seconds/ms (default now)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the files (``--out``) or check the queries (``--check``)."""
    if not dependencies_present("dashboards"):
        return 2
    if bool(args.out) == bool(args.check):
        print("argus dashboards: error: give --out DIR or --check URL", file=sys.stderr)
        return 2
    from argus_core.cli.rules import load

    config = load(args.config, 1.0, "dashboards")
    if config is None:
        return 2
    if args.check:
        return _check(args, config)
    paths = write(args.out, args.provider_path, config, "dashboards")
    for path in paths or ():
        print(path)
    return 0 if paths is not None else 1


def dependencies_present(command: str) -> bool:
    """Whether the dashboard generator's dependencies import (else says which is missing)."""
    try:
        import argus_grafana.generate  # noqa: F401 (imported for the check)
    except ModuleNotFoundError as exc:
        print(f"argus {command}: needs {exc.name}; install 'argus-failslow[dashboards]'",
              file=sys.stderr)
        return False
    return True


def write(out: str, provider_path: str | None, config, command: str):
    """Write the dashboards for ``config`` under ``out`` (the paths), or None after printing
    why one would not import into Grafana (nothing is written then)."""
    import json

    from argus_grafana import generate, schema
    from argus_grafana.queries import queries_for

    q = queries_for(config)
    for uid, build in generate.BUILDERS.items():  # never write what Grafana would refuse
        problems = schema.problems(json.loads(generate.encode(build(q))))
        if problems:
            print(f"argus {command}: {uid} is not valid Grafana 11.6 JSON:\n  "
                  + "\n  ".join(problems), file=sys.stderr)
            return None
    return generate.write_all(out, provider_path or generate.DEFAULT_PROVIDER_PATH, config)


def _check(args: argparse.Namespace, config) -> int:
    import json

    from argus_core.timeparse import parse_instant
    from argus_grafana import check, generate
    from argus_grafana.queries import queries_for

    q = queries_for(config)
    boards = {uid: json.loads(generate.encode(build(q)))
              for uid, build in generate.BUILDERS.items()}
    try:
        at = None if args.at is None else parse_instant(args.at) / 1e9
    except ValueError as exc:
        print(f"argus dashboards --check: error: --at {args.at!r}: {exc}", file=sys.stderr)
        return 2
    try:
        report = check.check_all(args.check, job=args.job, rate_interval=args.rate_interval,
                                 range_=args.range, at=at, boards=boards)
    except check.CheckError as exc:
        print(f"argus dashboards --check: error: {exc}", file=sys.stderr)
        return 2
    print(report.text())
    return 0 if report.ok else 1
