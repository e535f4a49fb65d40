"""Benchmark: wall time of ``argus diagnose`` on a simulated 512-rank job, and reading many
small kernel batches.

    python bench/diagnose.py [--json] [--dp 64] [--tp 8] [--steps 30]

1. The 512-rank, 30-step job (one NDJSON file per rank, as the exporters' file sink writes,
   one compute straggler) is simulated first, untimed. Then the real CLI runs as a
   subprocess. Baseline, timed in the same run: reading the same files with ``orjson.loads``
   per line (what the reader itself uses) and nothing else, so ``ratio_to_json_parse`` is what
   diagnosis costs on top of merely decoding its input.
2. Many small kernel batches: 245,760 kernel events in 61,440 batches of 4 (an exporter that
   flushes often). ``small_batches_load_s`` is ``load_traces`` (bulk-parsed batches);
   the baselines are orjson decoding alone and decoding plus ``parse_record`` per line (the
   reader before bulk parsing).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from _report import report

from argus_core.reader import load_traces
from argus_core.schema import parse_record
from argus_core.simulate import SimConfig, parse_fault, simulate, write_records
from argus_core.topology import Topology


def decode_only(files: list[Path]) -> float:
    """Seconds to orjson-decode every line of ``files``."""
    t0 = time.perf_counter()
    for path in files:
        with open(path, "rb") as handle:
            for line in handle:
                orjson.loads(line)
    return time.perf_counter() - t0


def small_batch_file(directory: Path, batches: int = 61_440, size: int = 4) -> Path:
    """One file of ``batches`` kernels records of ``size`` executions each, 8 ranks."""
    rng = np.random.default_rng(0)
    names = ["sm90_gemm_a", "sm90_gemm_b", "ncclDevKernel_AllReduce", "elementwise"]
    path = directory / "small.ndjson"
    with open(path, "wb") as out:
        for rank in range(8):
            out.write(orjson.dumps({"v": 1, "kind": "rank", "job": "small", "rank": rank,
                                    "world_size": 8}) + b"\n")
        start = 1_790_000_000_000_000_000
        for i in range(batches):
            out.write(orjson.dumps({
                "v": 1, "kind": "kernels", "job": "small", "rank": i % 8, "names": names,
                "name": rng.integers(0, 4, size).tolist(), "stream": [7] * size,
                "start_ns": (start + i * 100_000 + np.arange(size) * 1000).tolist(),
                "dur_ns": rng.integers(1000, 100_000, size).tolist()}) + b"\n")
    return path


def small_batches(directory: Path) -> dict:
    """Bulk load of many small batches against decoding, and decoding + per-line parsing."""
    path = small_batch_file(directory)
    decode_s = decode_only([path])
    t0 = time.perf_counter()
    with open(path, "rb") as handle:
        for line in handle:
            parse_record(orjson.loads(line))
    per_record_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = load_traces([path])
    load_s = time.perf_counter() - t0
    events = len(result.traces["small"].kernels)
    return {"small_batches_events": events, "small_batches_load_s": load_s,
            "small_batches_events_per_s": events / load_s,
            "small_batches_decode_only_s": decode_s,
            "small_batches_parse_each_record_s": per_record_s,
            "small_batches_ratio_to_decode": load_s / decode_s,
            "small_batches_speedup_vs_parse_each_record": per_record_s / load_s}


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
        parse_s = decode_only(files)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "argus_core.cli", "diagnose", directory,
                              "--json"], check=True, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as directory:
        small = small_batches(Path(directory))
    doc = json.loads(out.stdout)
    result = {"ranks": topology.world_size, "steps": args.steps, "input_mb": size / 2**20,
              "seconds": seconds, "json_parse_s": parse_s, "baseline": "orjson.loads per line",
              "ratio_to_json_parse": seconds / parse_s,
              "straggler_found": [v["rank"] for v in doc["verdict"]] == [slow], **small}
    report(result, args.json)


if __name__ == "__main__":
    main()
