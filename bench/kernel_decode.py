"""Benchmark: the kernel probe's decode per CUPTI record on a CPU, by buffer kind.

    python bench/kernel_decode.py [--records 38000] [--json]

One 8 MiB activity buffer's worth of kernel records (cupti-python 13.0.1's 216-byte
``activity_kernel10`` layout, 12 distinct names, 3 streams), decoded three ways, best of 5:

- ``tiled``: only kernel records (the normal case): one strided numpy view, names read once
  per distinct pointer.
- ``mixed_c``: one RUNTIME record after every 8 kernels (another CUPTI user in the process):
  walked with cuptiActivityGetNextRecord from C (the Argus shim), then gathered with numpy.
- ``mixed_python`` (the baseline, measured in the same run): the same buffer walked from
  Python, one ctypes call per record (the probe's fallback where the shim cannot be built).

GetNextRecord is the C stand-in for libcupti's (tests/cupti_standin; real CUPTI's costs more,
see bench/gpu_kernels_check.py). Needs gcc for the stand-in and the shim.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _report import report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from cupti_standin import RUNTIME_KIND, build

from argus_exporters.kernels import (
    CONCURRENT_KERNEL,
    CuptiLibrary,
    decode_kernel_buffer,
    kernel_record_dtypes,
    read_c_string,
)
from argus_exporters.kernels.plumbing import ShimLibrary

NAMES = [ctypes.create_string_buffer(f"kernel_{i}_sm90_xmma_gemm_bf16".encode())
         for i in range(12)]


def make_buffer(records: int, foreign_every: int, dtype: np.dtype,
                other: np.dtype) -> tuple[ctypes.Array, int, int]:
    """An 8-aligned buffer of kernel records with a RUNTIME record after every
    ``foreign_every`` kernels (0: none); (buffer, valid bytes, kernels)."""
    rng = np.random.default_rng(7)
    kernels = np.zeros(records, dtype=dtype)
    kernels["kind"] = CONCURRENT_KERNEL
    kernels["start"] = 1_790_000_000_000_000_000 + np.arange(records) * 5_000
    kernels["end"] = kernels["start"] + rng.integers(1_000, 4_000, records)
    kernels["stream_id"] = rng.choice([7, 13, 21], records)
    kernels["name"] = [ctypes.addressof(NAMES[i]) for i in rng.integers(0, 12, records)]
    runtime = np.zeros(1, dtype=other)
    runtime["kind"] = RUNTIME_KIND
    parts = []
    for i in range(records):
        parts.append(kernels[i:i + 1].tobytes())
        if foreign_every and i % foreign_every == foreign_every - 1:
            parts.append(runtime.tobytes())
    raw = b"".join(parts)
    buf = (ctypes.c_uint64 * (len(raw) // 8 + 1))()
    ctypes.memmove(buf, raw, len(raw))
    return buf, len(raw), records


def best_of(fn, repeats: int = 5) -> float:
    """The fastest of ``repeats`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    """Time the three decodes and report µs per record and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=38_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from cupti import cupti

    dtypes = kernel_record_dtypes()
    other = np.dtype(cupti.activity_api_dtype)
    folder = Path(tempfile.mkdtemp(prefix="argus-bench-"))
    library = CuptiLibrary(ctypes.CDLL(str(build(folder))), dtypes)
    # the stand-in's GetNextRecord needs its record sizes: configure it as the tests do
    library.lib.standin_configure.argtypes = [ctypes.c_uint64] * 6 + [ctypes.c_uint32,
                                                                      ctypes.c_uint64]
    fields = dtypes[0].fields
    library.lib.standin_configure(dtypes[0].itemsize, *(fields[f][1] for f in (
        "kind", "start", "end", "stream_id", "name")), RUNTIME_KIND, other.itemsize)
    shim = ShimLibrary.load({"ARGUS_CACHE_DIR": str(folder), "PATH": "/usr/bin:/bin"})
    next_record = library.next_record_address()

    tiled, tiled_valid, n = make_buffer(args.records, 0, dtypes[0], other)
    mixed, mixed_valid, _ = make_buffer(args.records, 8, dtypes[0], other)
    mixed_address = ctypes.addressof(mixed)

    def decode(buf, valid, index=None):
        view = (ctypes.c_char * valid).from_address(ctypes.addressof(buf))
        cols = decode_kernel_buffer(view, valid, read_c_string, candidates=dtypes,
                                    index_records=index)
        assert cols.count == n
        return cols

    def c_walk():
        return shim.index_records(next_record, mixed_address, mixed_valid, CONCURRENT_KERNEL)

    def python_walk():
        return library.index_records(mixed_address, mixed_valid, CONCURRENT_KERNEL)

    same = decode(tiled, tiled_valid).start_ns.tolist() == decode(
        mixed, mixed_valid, c_walk).start_ns.tolist() == decode(
        mixed, mixed_valid, python_walk).start_ns.tolist()
    seconds = {"tiled": best_of(lambda: decode(tiled, tiled_valid)),
               "mixed_c": best_of(lambda: decode(mixed, mixed_valid, c_walk)),
               "mixed_python": best_of(lambda: decode(mixed, mixed_valid, python_walk), 3)}
    us = {k: v / n * 1e6 for k, v in seconds.items()}
    report({"records": n, "tiled_us_per_record": us["tiled"],
            "mixed_c_us_per_record": us["mixed_c"],
            "mixed_python_us_per_record (baseline)": us["mixed_python"],
            "mixed_c_speedup_vs_python_walk": us["mixed_python"] / us["mixed_c"],
            "tiled_records_per_s": n / seconds["tiled"],
            "all_three_agree": same}, args.json)


if __name__ == "__main__":
    main()
