"""``argus stack up|status|down``: the whole Argus stack on one machine."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from argus_core.stack.engines import ENGINES, PROMETHEUS


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser(
        "stack", help="run Prometheus, Alertmanager, processor, scorer and S3 on this machine",
        description="Start (up), show (status) or stop (down) a local Argus stack in a working "
                    "directory: a metrics engine with the Argus rules (Prometheus, or "
                    "VictoriaMetrics: victoria-metrics, two vmagents sharing the targets, "
                    "vmalert), Alertmanager with the routing "
                    "and a webhook receiver logging to DIR/alerts.ndjson, the processor, the "
                    "scorer, an S3 server on loopback, and optionally live simulated jobs.")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="generate configs and start everything")
    up.add_argument("--workdir", required=True, metavar="DIR")
    up.add_argument("--simulate", action="append", default=[], metavar="CASE",
                    help="run a live simulated job of this case (repeatable), e.g. "
                         "compute-straggler, link-degradation, jit-stall, healthy")
    up.add_argument("--ranks", type=int, metavar="N", help="world size of the live jobs")
    up.add_argument("--time-scale", type=float, default=15.0, metavar="K",
                    help="run K times faster than production: 1 s scrapes and rule "
                         "evaluations, `for` durations / K (default 15)")
    up.add_argument("--rules-config", metavar="FILE", help="your overrides of the rules")
    up.add_argument("--engine", choices=ENGINES, default=PROMETHEUS,
                    help="what scrapes, stores and evaluates the rules (default prometheus)")
    status = actions.add_parser("status", help="print the endpoints")
    status.add_argument("--workdir", required=True, metavar="DIR")
    status.add_argument("--json", action="store_true",
                        help='print {"prometheus", "alertmanager", "processor", "scorer", '
                             '"s3"} URLs as JSON')
    targets = actions.add_parser(
        "targets", help="have the stack's Prometheus scrape a real job's ranks",
        description="Write DIR/targets/JOB.json (Prometheus file_sd) listing each rank's "
                    "/metrics: the ranks of a job started with ARGUS_METRICS_PORT=P serve "
                    "it on P + local rank, so --ports P-(P+N-1) names N ranks of one host. "
                    "Run again to replace the list; no targets removes it.")
    targets.add_argument("--workdir", required=True, metavar="DIR")
    targets.add_argument("--job", required=True, metavar="NAME", help="a name for the file")
    targets.add_argument("--host", default="127.0.0.1", help="host of --ports (127.0.0.1)")
    targets.add_argument("--ports", metavar="P-Q", help="a port range on --host, e.g. 9100-9103")
    targets.add_argument("target", nargs="*", metavar="HOST:PORT", help="more targets")
    down = actions.add_parser("down", help="stop everything the stack started")
    down.add_argument("--workdir", required=True, metavar="DIR")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the chosen action."""
    from argus_core.stack.stack import Stack, StackConfig, StackError, up

    try:
        if args.action == "up":
            if not math.isfinite(args.time_scale) or args.time_scale <= 0:
                raise StackError(f"--time-scale {args.time_scale:g}: expected a factor > 0")
            stack = up(StackConfig(Path(args.workdir), tuple(args.simulate), args.ranks,
                                   args.time_scale, args.rules_config, engine=args.engine))
            _print(stack, hint=True)
            return 0
        stack = Stack.load(args.workdir)
        if args.action == "targets":
            listed = [*_port_range(args.host, args.ports), *args.target]
            path = stack.add_targets(args.job, listed)
            print(f"{len(listed)} target(s) in {path}" if listed else f"removed {path}")
            return 0
        if args.action == "status":
            dead = stack.dead()
            if args.json:
                print(json.dumps(stack.endpoints))
            else:
                _print(stack, set(dead))
            if dead:
                print(f"argus stack: not running: {', '.join(dead)}", file=sys.stderr)
                return 1
            return 0
        left = stack.down()
        if left:
            print(f"argus stack: could not stop: {', '.join(left)}", file=sys.stderr)
            return 1
        print(f"stopped the stack in {args.workdir}")
        return 0
    except StackError as exc:
        print(f"argus stack: error: {exc}", file=sys.stderr)
        return 2


def _port_range(host: str, ports: str | None) -> list[str]:
    """'9100-9103' on a host -> its HOST:PORT targets."""
    from argus_core.stack.stack import StackError

    if not ports:
        return []
    lo, _, hi = ports.partition("-")
    if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo):
        raise StackError(f"--ports {ports!r}: expected P or P-Q with P <= Q")
    return [f"{host}:{p}" for p in range(int(lo), int(hi or lo) + 1)]


def _print(stack, dead: set[str] = frozenset(), hint: bool = False) -> None:
    """Each endpoint (a component that is not running says so next to its URL), each live
    job's state and log, the logs folder and the sink; with ``hint``, how a real job joins."""
    width = max(len(k) for k in stack.urls)
    engine = stack.info.get("engine", "prometheus")
    for name, url in stack.urls.items():
        note = "  (not running)" if name in dead else ""
        if name == "prometheus" and engine != "prometheus":
            note = f"  ({engine}'s Prometheus query API: Grafana's data source)"
        print(f"{name:>{width}}  {url}{note}")
    for process in stack.processes:
        if process.name.startswith("live-"):
            state = "running" if process.running else "stopped"
            print(f"{process.name:>{width}}  {state}, log {process.log}")
    print(f"{'logs':>{width}}  {stack.workdir / 'logs'}")
    print(f"{'sink':>{width}}  {stack.sink}")
    if not hint:
        return
    print(f"\nA real job: start its ranks with ARGUS_ENABLED=1 ARGUS_SINK={stack.sink} "
          f"ARGUS_METRICS_PORT=9100, then\n  argus stack targets --workdir {stack.workdir} "
          f"--job NAME --ports 9100-9103   (one port a local rank)")
