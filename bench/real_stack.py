"""Benchmark: the live alerts on real training jobs, the local stack fed by real torch jobs.

    python bench/real_stack.py [--json] [--minutes 6] [--cases straggler,healthy] [--dump DIR]
                               [--engine prometheus|victoriametrics]

For each case, ``argus stack up --engine ENGINE`` (Prometheus with the rules, or
victoria-metrics with two vmagents and vmalert; Alertmanager, the processor, the scorer, S3 on
loopback; time scale 15) and one real torch DDP job (4 ranks unless said) on CPU
(``tests/scripts/ddp_train.py``, the one-line instrument) posting its records to the stack's
sink and serving its metrics to the stack's Prometheus (``argus stack targets``), for
--minutes. ``straggler``: rank 1 sleeps 30 ms in every forward (a compute straggler, the
runbook's "ArgusStragglerRank" case); ``hog``: two ranks pinned one per core and a busy
process on rank 1's core (a rank short of CPU: ArgusRankShortOfCPU for rank 1, not
ArgusStragglerRank); ``healthy``: nothing. What reached Alertmanager's webhook is then compared
with what should have: the case's alert for its rank and no other fail-slow alert; nothing
fail-slow for the healthy job. The last line (--json) is
``{"cases": {NAME: {"fail_slow": [[alert, rank], ...], "as_expected": bool, "first_s": ...,
"regression": {"max_ratio", "min_threshold"}}}, "as_expected": bool}``: the regression rule's
highest ratio and lowest threshold over the run say how close a healthy job came to a page.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _report import report

from argus_core.rules.alerts import FAIL_SLOW
from argus_core.stack.processes import free_port
from argus_grafana.prometheus import api

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "ddp_train.py"
BIN = Path(sys.executable).parent
# name: (the job's fault, the alerts it should raise, its ranks)
CASES = {"straggler": ({"ARGUS_TEST_SLOW_RANK": "1", "ARGUS_TEST_FAULT": "forward",
                        "ARGUS_TEST_SLEEP_S": "0.03"}, {("ArgusStragglerRank", "1")}, 4),
         "hog": ({"ARGUS_TEST_SLOW_RANK": "1", "ARGUS_TEST_FAULT": "hog", "ARGUS_TEST_PIN": "1"},
                 {("ArgusRankShortOfCPU", "1")}, 2),
         "healthy": ({}, set(), 4)}


def argus(*args: str) -> subprocess.CompletedProcess:
    """The real command line."""
    return subprocess.run([sys.executable, "-m", "argus_core.cli", *args], text=True,
                          capture_output=True, timeout=300)


def run_case(name: str, minutes: float, workdir: Path, dump: Path | None = None,
             engine: str = "prometheus") -> dict:
    """One stack on ``engine``, one real job for ``minutes``; the fail-slow alerts that
    fired."""
    env_fault, expected, ranks = CASES[name]
    up = argus("stack", "up", "--workdir", str(workdir), "--engine", engine)
    if up.returncode != 0:
        raise RuntimeError(f"argus stack up failed: {up.stderr}")
    try:
        status = json.loads(argus("stack", "status", "--workdir", str(workdir), "--json").stdout)
        port = free_port()
        added = argus("stack", "targets", "--workdir", str(workdir), "--job", name, "--ports",
                      f"{port}-{port + ranks - 1}")
        if added.returncode != 0:
            raise RuntimeError(added.stderr)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ARGUS_ENABLED": "1",
               "ARGUS_SINK": status["sink"], "ARGUS_JOB": name, "ARGUS_METRICS_PORT": str(port),
               "ARGUS_TEST_INSTRUMENT": "1", "ARGUS_TEST_WIDTH": "1024",
               "ARGUS_TEST_SECONDS": str(minutes * 60), **env_fault}
        started = time.time()
        job = subprocess.run([str(BIN / "torchrun"), "--nproc-per-node", str(ranks),
                              "--master-port", str(free_port()), str(SCRIPT)], env=env,
                             capture_output=True, text=True, timeout=minutes * 60 + 300)
        if job.returncode != 0:
            raise RuntimeError(f"the job failed: {job.stderr[-20000:]}")
        time.sleep(5)  # the last scrape, evaluation and notification
        regression = regression_extremes(status["prometheus"], name, time.time() - started)
        if dump:
            dump_series(status["prometheus"], name, started, dump / f"{name}.json")
        fired = []
        alerts = Path(workdir / "alerts.ndjson")
        for line in alerts.read_text().splitlines() if alerts.exists() else []:
            note = json.loads(line)
            fired += [(note["received_at"], a["labels"]) for a in note["alerts"]
                      if a["status"] == "firing" and a["labels"]["alertname"] in FAIL_SLOW]
    finally:
        argus("stack", "down", "--workdir", str(workdir))
    found = {(labels["alertname"], labels.get("rank", "")) for _, labels in fired}
    first = {f"{a}/{r}": round(min(t for t, lab in fired if (lab["alertname"],
                                                          lab.get("rank", "")) == (a, r))
                               - started, 1) for a, r in found}
    wanted_ok = expected <= found
    extra = sorted(found - expected)
    return {"fail_slow": sorted(map(list, found)), "unexpected": [list(e) for e in extra],
            "first_s": first, "regression": regression, "as_expected": wanted_ok and not extra}


DUMPED = ("job:argus_iteration_seconds:max_rate", "job:argus_iteration_seconds:recent_median",
          "job:argus_iteration_regression:ratio", "job:argus_iteration_regression:threshold")


def dump_series(prometheus: str, job: str, started: float, path: Path) -> None:
    """The job's L1 trend series over its run, every 2 s ({name: [[t, value], ...]}): what
    the regression rule saw, to study its noise."""
    out = {}
    for name in DUMPED:
        result = api(prometheus, "/api/v1/query_range",
                     {"query": f'{name}{{job="{job}"}}', "start": f"{started:.3f}",
                      "end": f"{time.time():.3f}", "step": "2"})
        out[name] = [[float(t) - started, float(v)] for item in result["result"]
                     for t, v in item["values"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))


def regression_extremes(prometheus: str, job: str, seconds: float) -> dict:
    """The L1 regression rule's highest ratio and lowest threshold over the job's run (the
    threshold exists once the job is old enough for its noise to be read)."""
    out = {}
    for key, query in (("max_ratio", "max_over_time(job:argus_iteration_regression:ratio"),
                       ("min_threshold",
                        "min_over_time(job:argus_iteration_regression:threshold")):
        result = api(prometheus, "/api/v1/query",
                     {"query": f'{query}{{job="{job}"}}[{int(seconds) + 1}s])'})
        out[key] = round(float(result["result"][0]["value"][1]), 3) if result["result"] else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--engine", choices=("prometheus", "victoriametrics"),
                        default="prometheus")
    parser.add_argument("--dump", type=Path, metavar="DIR",
                        help="write each case's L1 trend series there (CASE.json)")
    args = parser.parse_args()
    results = {}
    for name in args.cases.split(","):
        if name not in CASES:
            parser.error(f"unknown case {name!r} (one of {', '.join(CASES)})")
        with tempfile.TemporaryDirectory() as tmp:
            results[name] = run_case(name, args.minutes, Path(tmp), args.dump, args.engine)
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    report({"engine": args.engine, "minutes": args.minutes, "cases": results,
            "as_expected": all(r["as_expected"] for r in results.values())}, args.json)


if __name__ == "__main__":
    main()
