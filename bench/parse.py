"""Benchmark: the processor's validation of one kernels record (10,000 kernels), per event.

    python bench/parse.py [--kernels 10000] [--repeat 7] [--json]

``parse_body`` on an NDJSON line with no ``true``/``false`` token (the normal body: the
per-value type check of the kernel columns is skipped, numpy's type inference refuses floats,
strings and huge integers) against the same body validated with the per-value check forced
(``may_hold_bools=True``, the path before this change and still the path of a line that holds a
bool token), and ``orjson.loads`` alone (the floor: decoding the JSON). CPU time per event, best
of ``--repeat`` runs of 20 bodies each, all in this process.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import orjson
from _report import report

from argus_core.processor import ingest


def body(kernels: int) -> bytes:
    """One kernels record as the exporters send it (50 names, 8 streams, 1 us apart)."""
    rng = np.random.default_rng(0)
    rec = {"v": 1, "kind": "kernels", "job": "bench", "rank": 3,
           "names": [f"kernel_{i}" for i in range(50)],
           "name": rng.integers(0, 50, kernels).tolist(),
           "stream": rng.integers(0, 8, kernels).tolist(),
           "start_ns": (1_790_000_000_000_000_000 + np.arange(kernels) * 1000).tolist(),
           "dur_ns": rng.integers(1000, 10**6, kernels).tolist()}
    return orjson.dumps(rec) + b"\n"


def ns_per_event(fn, kernels: int, repeat: int) -> float:
    """Best CPU nanoseconds per event over ``repeat`` runs of 20 calls."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(20):
            fn()
        best = min(best, (time.process_time() - t0) / 20 / kernels * 1e9)
    return best


def main() -> int:
    """Time the three paths, interleaved per repeat; print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = body(args.kernels)
    strict = ingest._bool_tokens
    assert len(ingest.parse_body(data).records) == 1

    def forced() -> None:
        ingest._bool_tokens = lambda text: True
        try:
            ingest.parse_body(data)
        finally:
            ingest._bool_tokens = strict

    paths = {"parse_ns_per_event": lambda: ingest.parse_body(data),
             "forced_check_ns_per_event": forced,
             "loads_ns_per_event": lambda: orjson.loads(data)}
    best = {k: float("inf") for k in paths}
    for _ in range(args.repeat):  # interleaved: a noisy neighbour hits every path alike
        for name, fn in paths.items():
            best[name] = min(best[name], ns_per_event(fn, args.kernels, 1))
    result = {"kernels": args.kernels, **{k: round(v, 1) for k, v in best.items()},
              "speedup_vs_forced_check": round(best["forced_check_ns_per_event"]
                                               / best["parse_ns_per_event"], 2)}
    report(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
