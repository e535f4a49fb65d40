"""The processor's /metrics at many ranks: rendering from pre-rendered lines against
prometheus-client's families of the same summaries (the baseline, measured in the same run).

    python bench/processor_metrics.py [--ranks 10000] [--kernels 32] [--json]

Each rank gets a kernel summary of ``--kernels`` rows (one cluster each: 3 series a row). The
baseline renders them as the processor once did, on every scrape: ``summary_families`` over
every job, then ``generate_latest``. The processor now renders each rank's lines once, when
its window is written (``summary_lines``, timed as ``lines_per_rank_ms``), and a scrape joins
them (``render_s``), up to ``--max-series`` series (the ranks beyond are left out and counted).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _report import report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from argus_core.processor.config import ProcessorConfig
from argus_core.processor.core import Processor
from argus_core.processor.metrics import ProcessorCollector, render_metrics
from argus_core.processor.windows import Window
from argus_core.summaries import KernelSummary

W = 60_000_000_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--kernels", type=int, default=32)
    parser.add_argument("--max-series", type=int, default=ProcessorConfig.max_metrics_series)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from prometheus_client import CollectorRegistry, generate_latest

    work = Path(tempfile.mkdtemp(prefix="argus-metrics-"))
    processor = Processor(ProcessorConfig(store=f"file://{work}/store",
                                          spool_dir=str(work / "spool"), durability="memory",
                                          top_k=args.kernels,
                                          max_metrics_series=args.max_series))
    names = [f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_{i}"
             for i in range(args.kernels)]
    rng = np.random.default_rng(0)
    k = args.kernels
    started = time.perf_counter()
    for rank in range(args.ranks):
        summary = KernelSummary(
            rank=np.full(k, rank), kernel=np.arange(k), stream=np.full(k, 7),
            window=np.full(k, 5), cluster=np.zeros(k, dtype=np.int64),
            count=rng.integers(10, 1000, k), sum_ns=rng.integers(10**6, 10**8, k),
            p50_ns=rng.integers(10**4, 10**6, k), p99_ns=rng.integers(10**6, 10**7, k),
            names=names, window_ns=W)
        processor._keep_summary(Window(f"job-{rank // 1000}", rank, 5, W), summary)
    keep_s = time.perf_counter() - started

    baseline = CollectorRegistry(auto_describe=False)
    baseline.register(ProcessorCollector(processor))
    started = time.perf_counter()
    old = generate_latest(baseline)
    baseline_s = time.perf_counter() - started

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessorCollector(processor, summaries=False))
    started = time.perf_counter()
    new = render_metrics(processor, registry)
    render_s = time.perf_counter() - started

    unbounded = processor.config.max_metrics_series >= 3 * k * args.ranks
    report({"ranks": args.ranks, "kernels_per_rank": k,
            "series": sum(1 for line in new.splitlines() if line.startswith(b"argus_kernel_")),
            "left_out_ranks": processor.stats.metrics_left_out,
            "baseline_render_s": baseline_s, "baseline_mb": len(old) / 2**20,
            "render_s": render_s, "render_mb": len(new) / 2**20,
            "speedup": baseline_s / render_s,
            "same_text": (sorted(old.splitlines()) == sorted(new.splitlines())
                          if unbounded else None),
            "lines_per_rank_ms": keep_s / args.ranks * 1e3,
            "summary_memory_mb": processor.stats.summary_bytes / 2**20}, args.json)
    processor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
