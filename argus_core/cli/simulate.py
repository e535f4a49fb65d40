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
    p.add_argument("--out", metavar="DIR", help="directory to write into (not with --live)")
    p.add_argument("--topology", help="axis sizes, e.g. dp=8,tp=2 (default: the case's)")
    p.add_argument("--steps", type=int, help="number of steps (default: the case's)")
    p.add_argument("--noise", type=float, default=0.03, help="kernel jitter (default 0.03)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", help="job name (default: the case name, or 'custom' with --fault)")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="inject a fault (repeatable); replaces the case's faults. "
                        "unit:kind=K:name=N degrades shared hardware (docs/diagnosis.md)")
    p.add_argument("--gzip", action="store_true", help="write .ndjson.gz files")
    p.add_argument("--fault-delay", type=int, default=0, metavar="STEPS",
                   help="start every fault this many steps later (a healthy baseline first)")
    live = p.add_argument_group(
        "live", "--live runs the job in real time: one /metrics endpoint per simulated host "
                "(the exporters' metrics), records posted to a processor as the exporters' "
                "HTTP sink posts them; until --steps are done (default: forever) or SIGTERM")
    live.add_argument("--live", action="store_true", help="run in real time")
    live.add_argument("--processor", metavar="URL",
                      help="where records go, e.g. http://127.0.0.1:9700/v1/records "
                           "(default: no records, metrics only)")
    live.add_argument("--targets", metavar="FILE",
                      help="write the hosts' endpoints as a Prometheus file_sd JSON file")
    live.add_argument("--listen", default="127.0.0.1", metavar="HOST",
                      help="address of the /metrics endpoints (default 127.0.0.1)")
    live.add_argument("--step-seconds", type=float, default=0.25, metavar="S",
                      help="real duration of a healthy step (default 0.25); faults stretch "
                           "steps in proportion")
    live.add_argument("--window-steps", type=int, default=32, metavar="N",
                      help="steps in the rolling-window gauges (ARGUS_WINDOW_STEPS)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    from argus_core.simulate import CASES, SimConfig, parse_fault, simulate, write_records
    from argus_core.simulate.placement import Hardware, parse_unit_fault
    from argus_core.topology import Topology

    try:
        case = CASES.get(args.case)
        topology = Topology.parse(args.topology) if args.topology else (
            case.topology if case else Topology(dp=8))
        hardware = case.hardware if case else None
        units = tuple(parse_unit_fault(f) for f in args.fault if f.startswith("unit:"))
        if units and hardware is None:
            hardware = Hardware()
        ranks = hardware.rank_records(args.job or args.case, topology) if units else {}
        faults = tuple(parse_fault(f) for f in args.fault if not f.startswith("unit:")) + tuple(
            f for unit in units for f in unit.faults(ranks)) if args.fault else (
            case.all_faults(topology) if case else ())
        if args.fault_delay < 0:
            raise ValueError(f"--fault-delay must be >= 0, got {args.fault_delay}")
        faults = tuple(delayed(f, args.fault_delay) for f in faults)
        job = args.job or ("custom" if args.fault else args.case)
        default_steps = (1 << 62) if args.live else (case.steps if case else 40)
        config = SimConfig(job=job, topology=topology,
                           steps=args.steps if args.steps is not None else default_steps,
                           noise=args.noise, faults=faults, seed=args.seed, hardware=hardware)
        if args.live == bool(args.out):
            raise ValueError("give --out DIR, or --live (not both)")
    except ValueError as exc:
        print(f"argus simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.live:
        return run_live(args, config)
    paths = write_records(simulate(config), args.out, compress=args.gzip)
    print(f"wrote {len(paths)} rank files for job {config.job!r} ({topology}, "
          f"{config.steps} steps, faults: {', '.join(map(str, faults)) or 'none'}) to {args.out}")
    return 0


def delayed(fault, steps: int):
    """The fault with its onset and stall steps ``steps`` later."""
    from dataclasses import replace

    return replace(fault, start=fault.start + steps,
                   end=None if fault.end is None else fault.end + steps,
                   steps=tuple(s + steps for s in fault.steps)) if steps else fault


def run_live(args: argparse.Namespace, config) -> int:
    """Run the job in real time until its steps are done or SIGTERM/SIGINT."""
    import logging
    import signal

    from argus_core.simulate.live import LiveConfig, LiveJob

    try:
        job = LiveJob(LiveConfig(sim=config, processor=args.processor,
                                 metrics_host=args.listen, targets_file=args.targets,
                                 step_seconds=args.step_seconds,
                                 window_steps=args.window_steps))
    except ValueError as exc:
        print(f"argus simulate: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: job.stop())
    job.start_clock()
    print(f"live job {config.job!r} ({config.topology}) started at {job.started_ns * 1e-9:.3f}, "
          f"a healthy step every {args.step_seconds:g} s; records to "
          f"{args.processor or 'nowhere'}", flush=True)
    for fault, step, at in job.onsets():
        print(f"fault {fault} begins at step {step}, at about {at:.3f}", flush=True)
    steps = job.run()
    print(f"live job {config.job!r} stopped after {steps} steps", flush=True)
    return 0
