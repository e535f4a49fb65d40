"""``argus diagnose PATH...``: read recorded traces and report L1-L3 findings and verdicts."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

PROGRESS_MIN_BYTES = 32 << 20  # below this, reading takes well under a few seconds
NOTHING_JUDGED = 3
"""Exit status when no level had data to judge (no steps, no kernels): not healthy, unknown."""


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser("diagnose", help="diagnose recorded traces (files, dirs, .gz, -)",
                            description="Progressive fail-slow diagnosis of recorded traces. "
                                        "Exit status: 0 diagnosed (levels without data are "
                                        "listed as not judged), 2 bad input, 3 no level had "
                                        "data to judge.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="NDJSON trace files or directories (recursively), .gz allowed, - = stdin")
    p.add_argument("--json", action="store_true", help="print the machine-readable document")
    p.add_argument("--plot", metavar="DIR", help="write PNG figures into DIR")
    p.add_argument("--job", help="job to diagnose when the input holds several")
    p.add_argument("--window", type=float, default=60.0, metavar="SECONDS",
                   help="kernel compression window (default 60)")
    p.add_argument("--peer-axis", default="pp", choices=["pp", "dp", "tp", "ep", ""],
                   help="L3 compares ranks at the same position on this axis (default pp; "
                        "'' compares every rank with every other)")
    p.set_defaults(run=run)


def _progress_total(paths: list[str]) -> int:
    from argus_core.reader import trace_files

    total = 0
    for source in trace_files(paths):
        if source != "-":
            total += os.path.getsize(source)
    return total


def load(paths: list[str]):
    """Load traces, with a progress bar on stderr for large inputs."""
    from argus_core.reader import load_traces

    total = _progress_total(paths)
    if total < PROGRESS_MIN_BYTES or not sys.stderr.isatty():
        return load_traces(paths)
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress("reading traces", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  transient=True) as progress:
        task = progress.add_task("read", total=total)
        return load_traces(paths, progress=lambda n: progress.advance(task, n))


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    from argus_core.detect.diagnose import DiagnoseConfig, diagnose
    from argus_core.reader import InputError
    from argus_core.report.coverage import LEVELS, not_judged

    if not math.isfinite(args.window) or args.window <= 0:
        print(f"argus diagnose: error: --window {args.window:g}: expected seconds > 0",
              file=sys.stderr)
        return 2
    try:
        result = load(args.paths)
    except InputError as exc:
        print(f"argus diagnose: error: {exc}", file=sys.stderr)
        return 2
    _report_rejects(result)
    if args.job is not None and args.job not in result.traces:
        print(f"argus diagnose: error: job {args.job!r} not in input (jobs: "
              f"{', '.join(sorted(result.traces))})", file=sys.stderr)
        return 2
    if args.job is None and len(result.traces) > 1:
        print(f"argus diagnose: error: the input holds {len(result.traces)} jobs "
              f"({', '.join(sorted(result.traces))}); choose one with --job", file=sys.stderr)
        return 2
    job = args.job or next(iter(result.traces))
    _report_restarts(result.traces[job].restarted_steps)
    config = DiagnoseConfig(window_s=args.window, peer_axis=args.peer_axis)
    diagnosis = diagnose(result.traces[job], config)
    blind = not_judged(diagnosis)
    if args.json:
        document = diagnosis.to_json()
        document["not_judged"] = [n.to_json() for n in blind]
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from rich.console import Console

        from argus_core.report.text import render

        render(diagnosis, Console(), rejected=result.rejected)
    if args.plot:
        from argus_core.report.plots import write_plots

        for path in write_plots(diagnosis, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:  # the text report says it in place
        for missing in blind:
            print(f"argus diagnose: warning: {missing.level.upper()} not judged: "
                  f"{missing.reason}", file=sys.stderr)
    return NOTHING_JUDGED if len(blind) == len(LEVELS) else 0


def _report_restarts(restarted: dict[int, int]) -> None:
    """Warn when ranks recorded the same step numbers at different times: a job restarted
    into the same spool, whose attempts the diagnosis now mixes."""
    if not restarted:
        return
    from argus_core.detect.verdict import ranks_text

    shown = ranks_text(restarted)
    print(f"argus diagnose: warning: {len(restarted)} rank(s) recorded the same step numbers at "
          f"different times (a job restarted into the same spool?): {shown}; the latest copy "
          f"of each step is kept, so the attempts are mixed: diagnose each attempt's files on "
          f"their own", file=sys.stderr)


def _report_rejects(result) -> None:
    for source in result.empty_sources:
        print(f"argus diagnose: warning: {source} is empty", file=sys.stderr)
    if not result.rejected:
        return
    reasons = ", ".join(f"{field} ({n})" for field, n in result.reject_counts.most_common())
    print(f"argus diagnose: warning: skipped {result.rejected} bad record(s) of "
          f"{result.records + result.rejected}: {reasons}", file=sys.stderr)
    for reject in result.rejects[:5]:
        print(f"  {reject}", file=sys.stderr)
