"""The ``argus`` command line. Subcommands import their heavy dependencies lazily, so the entry
point also works in a training image that installed only the ``exporters`` extra."""

from __future__ import annotations

import argparse
import os
import sys

from argus_core import __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    from argus_core.cli import (
        act,
        dashboards,
        demo,
        diagnose,
        generate,
        processor,
        rules,
        run,
        score,
        simulate,
        stack,
        traces,
    )

    parser = argparse.ArgumentParser(
        prog="argus", description="Always-on tracing and fail-slow diagnosis for GPU training.")
    parser.add_argument("--version", action="version", version=f"argus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (diagnose, simulate, demo, run, processor, traces, generate, rules, score,
                   act, stack, dashboards):
        module.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``argus`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ModuleNotFoundError as exc:
        extra = "service" if args.command in ("processor", "traces") else "analysis"
        print(f"argus {args.command}: needs the '{exc.name}' package; install the "
              f"'{extra}' extra (pip install '.[{extra}]' in a checkout, or the wheel with "
              f"[{extra}])", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (``argus diagnose --json | head``)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141
