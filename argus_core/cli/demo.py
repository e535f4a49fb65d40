"""``argus demo``: simulate the paper's five cases and a healthy run, diagnose each, compare.

Runs on the embedded default: the simulator writes the exporters' file-sink format into a
temporary directory and ``argus diagnose`` reads it back; no server is involved.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def register(commands) -> None:
    """Add the subcommand to the CLI."""
    p = commands.add_parser("demo", help="simulate and diagnose the paper's five cases",
                            description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", metavar="DIR", help="keep the simulated traces in DIR")
    p.set_defaults(run=run)


def brief(doc: dict) -> str:
    """One-line summary of a diagnose --json document."""
    parts = []
    if doc["l1"]["spikes"]:
        parts.append("L1 spikes " + ",".join(str(s["step"]) for s in doc["l1"]["spikes"]))
    if doc["l1"]["regressions"]:
        parts.append("L1 regression@" + ",".join(str(s["step"]) for s in doc["l1"]["regressions"]))
    by_rank: dict[int, list[str]] = {}
    for s in doc["l2"]["stragglers"]:
        by_rank.setdefault(s["rank"], []).append(s["phase"])
    if by_rank:
        parts.append("L2 " + " ".join(f"{r}:{'+'.join(p)}" for r, p in sorted(by_rank.items())))
    l3 = sorted({s["rank"] for s in doc["l3"]["stragglers"]})
    if l3:
        parts.append("L3 ranks " + ",".join(map(str, l3)))
    verdicts = " ".join(f"{v['rank']}={v['cause']}" for v in doc["verdict"])
    parts.append(f"verdict {verdicts}" if verdicts else "healthy")
    return "; ".join(parts)


def expected_brief(expect) -> str:
    """The same one-line summary for an Expectation."""
    l2: dict[int, list[str]] = {}
    for rank, phase in sorted(expect.l2):
        l2.setdefault(rank, []).append(phase)
    return brief({
        "l1": {"spikes": [{"step": s} for s in expect.spikes],
               "regressions": [{"step": expect.regression}] if expect.regression is not None
               else []},
        "l2": {"stragglers": [{"rank": r, "phase": p} for r, ps in l2.items() for p in ps]},
        "l3": {"stragglers": [{"rank": r} for r in expect.l3_ranks]},
        "verdict": [{"rank": r, "cause": c} for r, c in sorted(expect.verdicts.items())],
    })


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; exit status 1 when any case is misdiagnosed."""
    from rich.console import Console
    from rich.table import Table

    from argus_core.detect.diagnose import diagnose
    from argus_core.reader import load_traces
    from argus_core.simulate import CASES, simulate, write_records

    console = Console()
    table = Table("case", "expected", "found", "", title="Argus demo: paper case studies",
                  show_lines=True)
    failures = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="argus-demo-") as scratch:
        root = Path(args.keep or scratch)
        for name, case in CASES.items():
            directory = root / name
            write_records(simulate(case.config(seed=args.seed)), directory)
            doc = diagnose(load_traces([directory]).traces[name]).to_json()
            problems = case.expect.mismatches(doc)
            failures += bool(problems)
            table.add_row(case.title, expected_brief(case.expect), brief(doc),
                          "[green]ok[/green]" if not problems else "[red]MISS[/red]")
    console.print(table)
    console.print(f"{len(CASES) - failures}/{len(CASES)} cases diagnosed as expected in "
                  f"{time.perf_counter() - started:.1f} s"
                  + (f"; traces kept in {args.keep}" if args.keep else ""))
    console.print("Try one yourself: argus simulate --case compute-straggler --out /tmp/t && "
                  "argus diagnose /tmp/t")
    return 1 if failures else 0
