"""Benchmark: wall time of ``argus diagnose`` on a simulated 512-rank, 30-step job.

    python bench/diagnose.py [--json] [--ranks-dp 64] [--tp 8] [--steps 30]

The trace (one NDJSON file per rank, as the exporters' file sink writes) is simulated first,
untimed, with one compute straggler. Then the real CLI runs as a subprocess. Baseline, timed in
the same run: reading the same files with plain ``json.loads`` per line and nothing else, so
``ratio_to_json_parse`` is what diagnosis costs on top of merely parsing its input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _report import report

from argus_core.simulate import SimConfig, parse_fault, simulate, write_records
from argus_core.topology import Topology


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, default=64)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    topology = Topology(dp=args.dp, tp=args.tp)
    slow = topology.world_size // 3
    config = SimConfig(job="bench", topology=topology, steps=args.steps, seed=1,
                       faults=(parse_fault(f"compute:ranks={slow}:phases=mlp*3:from=10"),))
    with tempfile.TemporaryDirectory() as directory:
        write_records(simulate(config), directory)
        files = sorted(Path(directory).iterdir())
        size = sum(f.stat().st_size for f in files)

        t0 = time.perf_counter()
        for path in files:
            with open(path, "rb") as handle:
                for line in handle:
                    json.loads(line)
        parse_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "argus_core.cli", "diagnose", directory,
                              "--json"], check=True, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    doc = json.loads(out.stdout)
    result = {"ranks": topology.world_size, "steps": args.steps, "input_mb": size / 2**20,
              "seconds": seconds, "json_parse_s": parse_s, "ratio_to_json_parse": seconds / parse_s,
              "straggler_found": [v["rank"] for v in doc["verdict"]] == [slow]}
    report(result, args.json)


if __name__ == "__main__":
    main()
