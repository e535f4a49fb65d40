"""Benchmark: how long victoria-metrics takes to show what is written to it, started exactly
as ``argus stack up --engine victoriametrics`` starts it (``argus_core.stack.engines``).

    python bench/vm_visibility.py [--series 3] [--time-scale 1] [--json]

Each of ``--series`` new series gets its first sample through ``/api/v1/import/prometheus``
(as vmagent and vmalert write, timestamped now) and is queried every ``POLL_S`` until an
instant query returns it: ``new_series_seconds``. The baseline, measured in the same run on
series the store already holds (written once, then waited for): a new sample of each,
queried until its value shows (``new_sample_seconds``). Every recorded rule over a new
series (a new job's) is delayed by the first; why the rules chain at most two levels deep
(``argus_core.rules.recording``). ``--time-scale K``: the store as ``argus stack up`` starts it
K times faster than production (its ``-search.latencyOffset``, the scrape interval, with it):
at 1 (production) the offset, 15 s, hides every sample younger than it alike. Last line
(--json): medians, extremes and their ratio.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import orjson
from _report import report

from argus_core.rules.config import RulesConfig
from argus_core.stack import engines
from argus_core.stack.processes import free_port, start, wait_ready
from argus_core.stack.stack import binary

POLL_S = 0.05
GIVE_UP_S = 120.0


def write(url: str, name: str, value: float) -> float:
    """One sample of ``name`` timestamped now; when it was sent (monotonic)."""
    line = f'{name}{{bench="visibility"}} {value:g} {int(time.time() * 1000)}\n'.encode()
    sent = time.monotonic()
    request = urllib.request.Request(f"{url}/api/v1/import/prometheus", data=line)
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()
    return sent


def seconds_until(url: str, name: str, value: float, sent: float) -> float:
    """Seconds from ``sent`` until an instant query of ``name`` returns ``value``."""
    query = urllib.parse.urlencode({"query": name})
    while time.monotonic() - sent < GIVE_UP_S:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=30) as answer:
            result = orjson.loads(answer.read())["data"]["result"]
        if result and float(result[0]["value"][1]) == value:
            return time.monotonic() - sent
        time.sleep(POLL_S)
    raise SystemExit(f"{name} = {value:g} never became visible in {GIVE_UP_S:g} s")


def measure(url: str, series: int) -> dict:
    """New series first, then a new sample of each (the baseline)."""
    names = [f"argus_bench_visibility_{time.time_ns()}_{i}" for i in range(series)]
    new_series = [seconds_until(url, name, 1.0, write(url, name, 1.0)) for name in names]
    new_sample = [seconds_until(url, name, 2.0, write(url, name, 2.0)) for name in names]
    median_series = sorted(new_series)[len(new_series) // 2]
    median_sample = sorted(new_sample)[len(new_sample) // 2]
    return {"series": series,
            "new_series_seconds": round(median_series, 3),
            "new_series_seconds_range": [round(min(new_series), 3), round(max(new_series), 3)],
            "new_sample_seconds": round(median_sample, 3),
            "new_sample_seconds_range": [round(min(new_sample), 3), round(max(new_sample), 3)],
            "new_series_to_new_sample": round(median_series / median_sample, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="the stack's time scale (argus stack up: 15); 1: production")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.series < 1:
        parser.error("--series must be >= 1")
    if not args.time_scale >= 1:
        parser.error("--time-scale must be >= 1")
    workdir = Path(tempfile.mkdtemp(prefix="argus-vm-visibility-"))
    addr = {name: f"127.0.0.1:{free_port()}"
            for name in engines.components(engines.VICTORIAMETRICS)}
    files = {name: workdir / f"{name}.yml" for name in ("scrape", "recording", "alerting")}
    rules = RulesConfig().scaled(args.time_scale)
    store = engines.commands(engines.VICTORIAMETRICS, binary, rules, workdir, addr, files,
                             "127.0.0.1:9")[0]
    process = start(store.name, store.argv, workdir / "logs")
    try:
        wait_ready(process, store.ready, timeout=120)
        result = measure(f"http://{addr[store.name]}", args.series)
    finally:
        process.stop(60)
        shutil.rmtree(workdir, ignore_errors=True)
    flags = " ".join(store.argv[1:]).replace(str(workdir), "DIR")
    report({"time_scale": args.time_scale, "engine": f"{store.name} ({flags})", **result},
           args.json)


if __name__ == "__main__":
    main()
