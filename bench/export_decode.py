"""Benchmark: the scorer's decoding of sample values, in one orjson pass per block
(``vector_columns.json_numbers``) against the baseline of a ``float()`` per sample (the
previous reading, kept here), measured in the same run on the same answers.

    python bench/export_decode.py [--ranks 2000] [--kernels 100] [--repeats 5] [--json]

The answers are what the scorer reads of one job's kernel durations (ranks x kernels x 2
clusters x p50 and p99; random durations, written as their shortest text): victoria-metrics'
CSV export (``/api/v1/export/csv``, two samples a series), fed to ``CsvColumns`` in the 4 MiB
blocks the client reads, and Prometheus' instant-query answer (``decode_vector``). Reports
the whole decode's seconds each way (best of ``--repeats``), the ratio, and that both ways
give the same columns.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
from _report import report

from argus_core.score import csv_columns, vector_columns
from argus_core.score.csv_columns import CsvColumns
from argus_core.score.prometheus import EXPORT_BLOCK_BYTES
from argus_core.score.snapshot import SUMMARY_INTS, SUMMARY_TEXTS
from argus_core.score.vector_columns import VectorColumns, decode_vector

STAMP_MS = 1_764_547_200_123


def durations(ranks: int, kernels: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Every duration series' labels and value (seconds: 10 us to 100 ms, log-uniform)."""
    rng = np.random.default_rng(seed)
    n = ranks * kernels * 2 * 2
    rank = np.repeat(np.arange(ranks), kernels * 4)
    kernel = np.tile(np.repeat(np.arange(kernels), 4), ranks)
    cluster = np.tile([0, 0, 1, 1], ranks * kernels)
    quantile = np.tile([0, 1], ranks * kernels * 2)
    return rank, kernel, cluster, quantile, np.exp(rng.uniform(np.log(1e-5), np.log(0.1), n))


def export_csv(columns: tuple[np.ndarray, ...]) -> bytes:
    """The series as victoria-metrics exports them: a row a sample, two samples each."""
    rank, kernel, cluster, quantile, value = columns
    q = ("0.5", "0.99")
    rows = [f"{r},7,{c},{STAMP_MS + 15_000 * s},{v!r},kernel_{k},{q[p]}\n"
            for s in (0, 1) for r, k, c, p, v in zip(rank.tolist(), kernel.tolist(),
                                                      cluster.tolist(), quantile.tolist(),
                                                      value.tolist(), strict=True)]
    return "".join(rows).encode()


def query_answer(columns: tuple[np.ndarray, ...]) -> bytes:
    """The series as Prometheus answers an instant query (labels sorted, positional values)."""
    rank, kernel, cluster, quantile, value = columns
    q = ("0.5", "0.99")
    rows = [f'{{"metric":{{"cluster":"{c}","kernel":"kernel_{k}","quantile":"{q[p]}",'
            f'"rank":"{r}","stream":"7"}},"value":[1764547200.123,'
            f'"{np.format_float_positional(v, trim="-")}"]}}'
            for r, k, c, p, v in zip(rank.tolist(), kernel.tolist(), cluster.tolist(),
                                     quantile.tolist(), value.tolist(), strict=True)]
    return (vector_columns.HEADER + ",".join(rows).encode() + vector_columns.END)


def read_export(data: bytes) -> VectorColumns:
    columns = CsvColumns(SUMMARY_INTS, SUMMARY_TEXTS)
    for first in range(0, len(data), EXPORT_BLOCK_BYTES):
        columns.feed(data[first:first + EXPORT_BLOCK_BYTES])
    return columns.latest()


def read_query(data: bytes) -> VectorColumns:
    columns = decode_vector(data, SUMMARY_INTS, SUMMARY_TEXTS)
    assert columns is not None, "the answer fell back to JSON"
    return columns


def best(call: Callable[[], VectorColumns], repeats: int) -> tuple[VectorColumns, float]:
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call()
        seconds.append(time.perf_counter() - t0)
    return out, min(seconds)


def same(a: VectorColumns, b: VectorColumns) -> bool:
    return (all(np.array_equal(a.ints[k], b.ints[k]) for k in a.ints)
            and all(a.texts[k].strings() == b.texts[k].strings() for k in a.texts)
            and np.array_equal(a.values, b.values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2_000)
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    series = durations(args.ranks, args.kernels)
    result: dict = {"ranks": args.ranks, "kernels": args.kernels, "series": len(series[0])}
    for name, make, read in (("export", export_csv, read_export),
                             ("query", query_answer, read_query)):
        data = make(series)
        new, new_s = best(lambda data=data, read=read: read(data), args.repeats)
        # the baseline: every value read by float(), as before json_numbers
        with mock.patch.object(csv_columns, "json_numbers", lambda *_: None), \
                mock.patch.object(vector_columns, "json_numbers", lambda *_: None):
            old, old_s = best(lambda data=data, read=read: read(data), args.repeats)
        result.update({f"{name}_bytes": len(data), f"{name}_baseline_seconds": old_s,
                       f"{name}_seconds": new_s, f"{name}_ratio_to_baseline": new_s / old_s,
                       f"{name}_series_per_second": len(new) / new_s,
                       f"{name}_same_columns": same(new, old)})
    report(result, args.json)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
