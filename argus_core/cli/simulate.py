"""``argus simulate``: write schema-v1 records of a synthetic job with injected faults."""

from __future__ import annotations

import argparse
import sys


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    from argus_core.simulate.cases import CASES

    p = commands.add_parser(
        "simulate", help="write a synthetic job's trace (paper cases, healthy, or custom)",
        description="Simulate a synchronous training job and write one NDJSON file per rank. "
                    "Faults: compute:ranks=5:phases=mlp*3:from=10, "
                    "link:ranks=4-7:axis=tp:factor=8:ops=AllGather*12, "
                    "stall:ranks=3:steps=12,27:seconds=2.5")
    p.add_argument("--case", default="healthy", choices=[*CASES, "custom"],
                   help="preset (default healthy); 'custom' starts with no fault")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    p.add_argument("--topology", help="axis sizes, e.g. dp=8,tp=2 (default: the case's)")
    p.add_argument("--steps", type=int, help="number of steps (default: the case's)")
    p.add_argument("--noise", type=float, default=0.03, help="kernel jitter (default 0.03)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", help="job name (default: the case name, or 'custom' with --fault)")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="inject a fault (repeatable); replaces the case's faults")
    p.add_argument("--gzip", action="store_true", help="write .ndjson.gz files")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    from argus_core.simulate import CASES, SimConfig, parse_fault, simulate, write_records
    from argus_core.topology import Topology

    try:
        case = CASES.get(args.case)
        topology = Topology.parse(args.topology) if args.topology else (
            case.topology if case else Topology(dp=8))
        faults = tuple(parse_fault(f) for f in args.fault) if args.fault else (
            case.faults if case else ())
        job = args.job or ("custom" if args.fault else args.case)
        config = SimConfig(job=job, topology=topology,
                           steps=args.steps if args.steps is not None else (
                               case.steps if case else 40), noise=args.noise,
                           faults=faults, seed=args.seed)
    except ValueError as exc:
        print(f"argus simulate: error: {exc}", file=sys.stderr)
        return 2
    paths = write_records(simulate(config), args.out, compress=args.gzip)
    print(f"wrote {len(paths)} rank files for job {config.job!r} ({topology}, "
          f"{config.steps} steps, faults: {', '.join(map(str, faults)) or 'none'}) to {args.out}")
    return 0
