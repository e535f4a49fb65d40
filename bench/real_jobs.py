"""Benchmark: the diagnosis on real training jobs (torch DDP on CPU, gloo), not the simulator.

    python bench/real_jobs.py [--json] [--runs 3] [--cases healthy-2,forward-2] [--record DIR]
                              [--busy N [--busy-period 3]]

Every case starts a real job with ``torchrun``, the one-line ``instrument`` or zero-code
``argus run``: DDP jobs (``tests/scripts/ddp_train.py``: 1, 2, 4 or 8 ranks) healthy or with
one fault injected on one rank (slow forward or backward, sustained or intermittent host
stalls, a slow data loader, a CPU hog on the rank's core from the start or from step 30 of a
one-rank job, slow forwards on a tenth of the steps), and jobs of every parallelism
(``tests/scripts/parallel_train.py``: DDP, FSDP2, DTensor tensor parallel, a send/recv
pipeline, an all-to-all MoE layer) healthy, with a late rank and with a slow one, and a
four-stage pipeline with a slow link between two stages (both ends are to be named, each
with the other as its ``peer``). Each spools its records to files and is
diagnosed. A case is as expected when the verdicts name exactly the faulty rank with its cause
(healthy: no verdict at all; a slow link: its two ends, each naming the other as peer);
``false_verdicts`` counts verdicts on ranks no fault touched. The machine's own noise (other
ranks on the same cores, the scheduler, the garbage collector) is what the diagnosis must see
through. ``--record DIR`` keeps each run's spool as ``DIR/CASE.ndjson.gz`` (the recordings
under tests/data/real_jobs came from it). A job that exits non-zero is counted in
``job_failures`` (its stderr kept beside the recordings, or under the
``argus-real-jobs`` folder of the system's temporary directory) and the other cases still run.
``--busy N`` runs every case beside N busy processes, each stopped and resumed at random
every 0.3 to ``--busy-period`` s: a loaded machine's interference, as on a busy CI runner. The
last line (--json) is ``{"runs", "cases", "as_expected", "false_verdicts", ...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from _report import report

from argus_core.detect.diagnose import diagnose
from argus_core.reader import load_traces
from argus_core.stack.processes import free_port

SCRIPTS = Path(__file__).resolve().parent.parent / "tests" / "scripts"
SCRIPT = SCRIPTS / "ddp_train.py"
PARALLEL_SCRIPT = SCRIPTS / "parallel_train.py"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Case:
    """One real job: its size, how it is instrumented, its fault and the expected verdicts."""

    name: str
    ranks: int
    env: dict[str, str] = field(default_factory=dict)
    expected: dict[int, str] = field(default_factory=dict)
    zero_code: bool = False  # ``argus run`` instead of the one-line instrument
    script: Path = SCRIPT

    @property
    def peers(self) -> dict[int, int]:
        """The peer each verdict must name: the link's other end (a slow-link case only)."""
        if self.env.get("ARGUS_TEST_FAULT") != "link":
            return {}
        a, b = sorted(self.expected)
        return {a: b, b: a}


def _fault(rank: int, kind: str, seconds: float, **extra: str) -> dict[str, str]:
    return {"ARGUS_TEST_SLOW_RANK": str(rank), "ARGUS_TEST_FAULT": kind,
            "ARGUS_TEST_SLEEP_S": str(seconds), **extra}


CASES = [
    Case("healthy-1", 1),
    Case("healthy-2", 2),
    Case("healthy-2-zero-code", 2, zero_code=True),
    Case("healthy-4", 4),
    Case("healthy-8", 8),
    Case("forward-2", 2, _fault(1, "forward", 0.02), {1: "compute"}),
    Case("forward-8-late", 8, _fault(5, "forward", 0.03, ARGUS_TEST_FROM="25"),
         {5: "compute"}),
    Case("backward-4-zero-code", 4, _fault(2, "backward", 0.02), {2: "compute"},
         zero_code=True),
    Case("host-4", 4, _fault(3, "host", 0.05), {3: "host"}),
    Case("stall-2", 2, _fault(0, "stall", 0.4, ARGUS_TEST_STALL_STEPS="20,45"), {0: "host"}),
    Case("stall-1", 1, _fault(0, "stall", 0.08, ARGUS_TEST_STALL_STEPS="20,45"), {0: "host"}),
    Case("data-2", 2, _fault(1, "data", 0.03, ARGUS_TEST_FROM="20"), {1: "host"}),
    Case("hog-2", 2, _fault(1, "hog", 0.0, ARGUS_TEST_PIN="1"), {1: "host"}),
    Case("hog-1-late", 1, _fault(0, "hog", 0.0, ARGUS_TEST_PIN="1", ARGUS_TEST_FROM="30"),
         {0: "host"}),
    Case("tail-4", 4, _fault(1, "tail", 0.08, ARGUS_TEST_TAIL_SHARE="0.1"), {1: "compute"}),
]
PARALLEL_RANKS = {"ddp": 2, "fsdp1": 2, "fsdp2": 2, "tp": 2, "moe": 2,
                  "pp": 4}  # pp: 2 stages x 2 dp


def _parallel_cases() -> list[Case]:
    """Every parallelism (``tests/scripts/parallel_train.py``) healthy, with a late rank (a
    host sleep before each forward) and a slow one (extra compute in forward), one-line and
    zero-code; each of the three also compiled. Rank 1 is the faulty one,
    from step 10 on, 20 ms a step; the model is 256 wide (steps of ~4-10 ms on a shared core)."""
    cases = []
    for parallel, ranks in PARALLEL_RANKS.items():
        base = {"ARGUS_TEST_PARALLEL": parallel, "ARGUS_TEST_FROM": "10",
                "ARGUS_TEST_WIDTH": "256"}
        late = {**base, **_fault(1, "host", 0.02)}
        slow = {**base, **_fault(1, "compute", 0.02)}
        cases += [Case(f"{parallel}-healthy-{ranks}", ranks, base, script=PARALLEL_SCRIPT),
                  Case(f"{parallel}-late-{ranks}", ranks, late, {1: "host"},
                       script=PARALLEL_SCRIPT),
                  Case(f"{parallel}-slow-{ranks}", ranks, slow, {1: "compute"},
                       script=PARALLEL_SCRIPT),
                  Case(f"{parallel}-slow-{ranks}-zero-code", ranks, slow, {1: "compute"},
                       zero_code=True, script=PARALLEL_SCRIPT),
                  Case(f"{parallel}-late-{ranks}-zero-code", ranks, late, {1: "host"},
                       zero_code=True, script=PARALLEL_SCRIPT)]
        # compiled (torch.compile, eager backend): instrumented then compiled, and the
        # compiled model instrumented
        cases += [Case(f"{parallel}-healthy-{ranks}-compiled", ranks,
                       {**base, "ARGUS_TEST_COMPILE": "1"}, script=PARALLEL_SCRIPT),
                  Case(f"{parallel}-late-{ranks}-compiled", ranks,
                       {**late, "ARGUS_TEST_COMPILE": "1"}, {1: "host"}, script=PARALLEL_SCRIPT),
                  Case(f"{parallel}-slow-{ranks}-compiled-first", ranks,
                       {**slow, "ARGUS_TEST_COMPILE": "first"}, {1: "compute"},
                       script=PARALLEL_SCRIPT)]
    return cases


def _pipeline_cases() -> list[Case]:
    """A pipeline of four stages (one rank each, GPipe with four micro-batches): healthy, a
    late stage, a slow stage, and a slow link between two stages (each send between them
    delivers its data late) from step 10 or step 30, 5 or 2 ms a send."""
    base = {"ARGUS_TEST_PARALLEL": "pp4", "ARGUS_TEST_FROM": "10", "ARGUS_TEST_WIDTH": "256"}
    return [
        Case("pp4-healthy-4", 4, base, script=PARALLEL_SCRIPT),
        Case("pp4-late-4", 4, {**base, **_fault(2, "host", 0.02)}, {2: "host"},
             script=PARALLEL_SCRIPT),
        Case("pp4-slow-4", 4, {**base, **_fault(1, "compute", 0.02)}, {1: "compute"},
             script=PARALLEL_SCRIPT),
        Case("pp4-link-4", 4, {**base, **_fault(1, "link", 0.005)},
             {1: "communication", 2: "communication"}, script=PARALLEL_SCRIPT),
        Case("pp4-link-4-late", 4, {**base, **_fault(0, "link", 0.002),
                                    "ARGUS_TEST_FROM": "30"},
             {0: "communication", 1: "communication"}, script=PARALLEL_SCRIPT),
    ]


CASES += _parallel_cases() + _pipeline_cases()
STEPS = 60
WIDTH = 1024  # ~20 ms steps on one core


def run_case(case: Case, spool: Path, steps: int = STEPS) -> None:
    """Run the case's job to completion, spooling its records under ``spool``."""
    torchrun = [str(BIN / "torchrun"), "--nproc-per-node", str(case.ranks), "--master-port",
                str(free_port()), str(case.script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ARGUS_TEST_STEPS": str(steps),
           "ARGUS_TEST_WIDTH": str(WIDTH), **case.env}
    if case.zero_code:
        command = [str(BIN / "argus"), "run", "--sink", f"file://{spool}", "--job", case.name,
                   "--", *torchrun]
    else:
        command = torchrun
        env.update(ARGUS_ENABLED="1", ARGUS_SINK=f"file://{spool}", ARGUS_JOB=case.name,
                   ARGUS_TEST_INSTRUMENT="1")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise JobFailedError(case.name, proc.returncode, proc.stderr)


class JobFailedError(RuntimeError):
    """A real job exited non-zero: its exit status and whole stderr."""

    def __init__(self, name: str, returncode: int, stderr: str):
        lines = stderr.strip().splitlines()
        # torchrun closes with a summary of which rank died; the cause is what that rank
        # printed before it, so show the lines above the summary
        summary = next((i for i, line in enumerate(lines)
                        if "ChildFailedError" in line or line.startswith("Root Cause")), len(lines))
        cause = "\n".join(lines[max(0, summary - 40):summary])
        super().__init__(f"{name}: the job exited {returncode}; its stderr before torchrun's "
                         f"summary:\n{cause}\n...\n" + "\n".join(lines[-8:]))
        self.stderr = stderr


def judge(case: Case, spool: Path) -> dict:
    """The case's verdicts against what is expected."""
    trace = load_traces([spool]).traces[case.name]
    doc = diagnose(trace).to_json()
    found = {v["rank"]: v["cause"] for v in doc["verdict"]}
    peers = {v["rank"]: v["peer"] for v in doc["verdict"] if "peer" in v}
    false = sorted(r for r in found if r not in case.expected)
    starved = sorted(v["rank"] for v in doc["verdict"]
                     if v["cause"] == "host" and v["evidence"].startswith("short of CPU"))
    return {"case": case.name, "as_expected": found == case.expected and peers == case.peers,
            "verdicts": found, "false_ranks": false, "short_of_cpu": starved,
            "evidence": [v["evidence"] for v in doc["verdict"]]}


def record(spool: Path, out: Path) -> None:
    """Concatenate a spool's files into one gzip NDJSON recording."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wb", compresslevel=9) as sink:
        for path in sorted(spool.rglob("*")):
            if path.is_file():
                opener = gzip.open if path.suffix == ".gz" else open
                with opener(path, "rb") as source:
                    shutil.copyfileobj(source, sink)


@contextlib.contextmanager
def busy_neighbours(count: int, period_s: float):
    """``count`` busy processes, each stopped and resumed at random every 0.3 to
    ``period_s`` s while the block runs (a loaded machine's interference); gone after it.
    Yields their process ids."""
    if count < 1:
        yield []
        return
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(count)]
    done = threading.Event()

    def toggle() -> None:
        running = True
        while not done.wait(random.uniform(0.3, period_s)):
            running = not running
            for spinner in spinners:
                with contextlib.suppress(OSError):
                    os.kill(spinner.pid, signal.SIGCONT if running else signal.SIGSTOP)

    toggler = threading.Thread(target=toggle, daemon=True)
    toggler.start()
    try:
        yield [spinner.pid for spinner in spinners]
    finally:
        done.set()
        toggler.join()
        for spinner in spinners:
            with contextlib.suppress(OSError):
                os.kill(spinner.pid, signal.SIGCONT)
            spinner.kill()
            spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default="", help="comma-separated case names (default all)")
    parser.add_argument("--parallel", action="store_true",
                        help="only the cases of every parallelism (parallel_train.py)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--record", type=Path, help="keep each run's spool here")
    parser.add_argument("--busy", type=int, default=0,
                        help="busy processes beside the jobs, stopped and resumed at random")
    parser.add_argument("--busy-period", type=float, default=3.0,
                        help="the longest a busy process runs or rests, seconds (default 3)")
    args = parser.parse_args()
    if args.busy < 0 or not args.busy_period > 0.3:
        parser.error("--busy must be >= 0 and --busy-period > 0.3")
    wanted = set(filter(None, args.cases.split(",")))
    unknown = wanted - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    cases = [c for c in CASES if (not wanted or c.name in wanted)
             and (not args.parallel or c.script == PARALLEL_SCRIPT)]
    results, failures, start = [], [], time.perf_counter()
    with busy_neighbours(args.busy, args.busy_period):
        _run_all(args, cases, results, failures)
    missed = sorted({r["case"] for r in results if not r["as_expected"]})
    report({"runs": args.runs, "cases": len(cases), "busy": args.busy,
            "as_expected": sum(r["as_expected"] for r in results),
            "false_verdicts": sum(len(r["false_ranks"]) for r in results),
            "not_as_expected": missed, "job_failures": failures,
            "seconds": round(time.perf_counter() - start, 1)},
           args.json)


def _run_all(args: argparse.Namespace, cases: list[Case], results: list[dict],
             failures: list[dict]) -> None:
    """Every run of every case, judged; a job that fails is counted in ``failures``."""
    for run in range(args.runs):
        for case in cases:
            with tempfile.TemporaryDirectory() as tmp:
                spool = Path(tmp) / "spool"
                try:
                    run_case(case, spool, args.steps)
                except JobFailedError as exc:  # counted, kept, and the other cases still run
                    failures.append({"case": case.name, "run": run, "error": str(exc)})
                    logs = args.record or Path(tempfile.gettempdir()) / "argus-real-jobs"
                    log = logs / f"{case.name}-run{run}.stderr.txt"
                    log.parent.mkdir(parents=True, exist_ok=True)
                    log.write_text(exc.stderr)
                    print(f"FAILED run {run} {case.name}: {exc}; stderr in {log}",
                          file=sys.stderr, flush=True)
                    continue
                outcome = judge(case, spool)
                if args.record:
                    suffix = f"-run{run}" if args.runs > 1 else ""
                    record(spool, args.record / f"{case.name}{suffix}.ndjson.gz")
            outcome["run"] = run
            results.append(outcome)
            mark = "ok " if outcome["as_expected"] else "BAD"
            print(f"{mark} run {run} {case.name}: {outcome['verdicts']} "
                  f"{'; '.join(outcome['evidence'])[:300]}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
