"""Benchmark: decoding request bodies of many gzip members (or zstd frames) stays linear.

    python bench/decode.py [--json]

Times ``decode_body`` on bodies of 8,192 to 65,536 empty gzip members and zstd frames, and
fits the exponent of time against members (1.0 is linear). Baseline in the same run: the
previous member loop (each member re-sliced the rest of the body: quadratic), on the same
bodies up to 32,768 members. Also one large ordinary body (32 MB of NDJSON, one member) for the
throughput of the common case.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
import zlib

import numpy as np
from _report import report

from argus_core.processor.ingest import decode_body

SIZES = (8_192, 16_384, 32_768, 65_536)


def previous_inflate(body: bytes, max_bytes: int) -> bytes:
    """The member loop before this change, kept as the baseline: quadratic in members."""
    parts, size, rest = [], 0, body
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        part = inflater.decompress(rest, max_bytes + 1 - size)
        size += len(part)
        parts.append(part)
        rest = inflater.unused_data
        if not rest:
            return b"".join(parts)


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def exponent(sizes, seconds) -> float:
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from backports import zstd

    member, frame = gzip.compress(b""), zstd.compress(b"")
    gz = [best_of(lambda n=n: decode_body(member * n, "gzip", 1 << 20)) for n in SIZES]
    zs = [best_of(lambda n=n: decode_body(frame * n, "zstd", 1 << 20)) for n in SIZES]
    old_sizes = SIZES[:3]
    old = [best_of(lambda n=n: previous_inflate(member * n, 1 << 20), 1) for n in old_sizes]
    line = b'{"v":1,"kind":"kernels","job":"j","rank":0,"names":["gemm"],"name":[0,0,0,0],' \
           b'"stream":[7,7,7,7],"start_ns":[1,2,3,4],"dur_ns":[5,6,7,8]}\n'
    big = gzip.compress(line * (32 * 2**20 // len(line)), 1)
    one = best_of(lambda: decode_body(big, "gzip", 64 << 20))
    out = {"members": list(SIZES),
           "gzip_seconds": [round(t, 4) for t in gz], "gzip_exponent": exponent(SIZES, gz),
           "zstd_seconds": [round(t, 4) for t in zs], "zstd_exponent": exponent(SIZES, zs),
           "gzip_us_per_member_at_65536": gz[-1] / SIZES[-1] * 1e6,
           "baseline_previous_seconds": [round(t, 3) for t in old],
           "baseline_previous_exponent": exponent(old_sizes, old),
           "speedup_at_32768_members": old[-1] / gz[2],
           "large_body_mb_per_s": 32 / one}
    report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
