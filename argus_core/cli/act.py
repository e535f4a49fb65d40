"""``argus act``: turn sustained hardware suspects into a drain or cordon plan (dry run)."""

from __future__ import annotations

import argparse
import logging
import sys

from argus_core.act.plan import TEMPLATES


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser(
        "act", help="receive ArgusSuspectUnit alerts and plan drains (dry run by default)",
        description="An Alertmanager webhook receiver (POST /webhook): a hardware unit named "
                    "by ArgusSuspectUnit for --hold becomes a drain or cordon of its node "
                    "through the scheduler's command (network units: a ticket), at most "
                    "--budget nodes per --budget-window, never a job's last node not drained. "
                    "Commands run only with --execute, as an argument vector (no shell). The "
                    "plan is on /plan (JSON) and /metrics; every decision is a line of "
                    "--audit.")
    p.add_argument("--listen", default="127.0.0.1:9810", metavar="HOST:PORT",
                   help="where /webhook, /plan and /metrics are served (default "
                        "127.0.0.1:9810)")
    p.add_argument("--scheduler", default="kubernetes", choices=sorted(TEMPLATES),
                   help="the command template: " + "; ".join(
                       f"{k}: {v}" for k, v in sorted(TEMPLATES.items())))
    p.add_argument("--command", default=None, metavar="TEMPLATE",
                   help="any other command, split as a shell would but never run by one; "
                        "placeholders {node} {unit} {unit_kind} {job} {cause} {reason}")
    p.add_argument("--hold", default="10m", metavar="DURATION",
                   help="how long a unit's alert must fire without a break (default 10m)")
    p.add_argument("--budget", type=int, default=2, metavar="N",
                   help="nodes drained at most per --budget-window (default 2)")
    p.add_argument("--budget-window", default="1h", metavar="DURATION",
                   help="the budget's window (default 1h)")
    p.add_argument("--prometheus", metavar="URL",
                   help="where argus_rank_info says which hosts each job runs on (so a job's "
                        "last node is never drained); without it that check is off")
    p.add_argument("--audit", metavar="FILE", help="append every decision as a JSON line")
    p.add_argument("--execute", action="store_true",
                   help="run the commands (default: a dry run that only plans)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until killed."""
    from pathlib import Path

    from argus_core.act.plan import ActConfig, Planner
    from argus_core.act.service import job_hosts_from, serve
    from argus_core.cli.listen import host_port
    from argus_core.timeparse import parse_duration

    try:
        host, port = host_port(args.listen)
        config = ActConfig(hold_s=parse_duration(args.hold), budget=args.budget,
                           budget_window_s=parse_duration(args.budget_window),
                           command=args.command or TEMPLATES[args.scheduler],
                           execute=args.execute)
        hosts = None
        if args.prometheus:
            from argus_core.score.prometheus import PrometheusAPI

            hosts = job_hosts_from(PrometheusAPI(args.prometheus))
        audit = Path(args.audit) if args.audit else None
        if audit is not None:
            audit.parent.mkdir(parents=True, exist_ok=True)
            audit.touch()
    except (OSError, ValueError) as exc:
        print(f"argus act: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(Planner(config, audit, hosts), host, port)
    return 0
