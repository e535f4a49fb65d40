"""Benchmark: the exporter's cost per training step on CPU, and flat memory over 10,000 steps.

    python bench/exporter_cpu.py [--steps 10000] [--json]

A stand-in training step (single-threaded numpy matmuls, ~2 ms) runs with four phases per
step (forward, backward, dp-allreduce, optimizer). Overhead: 20 interleaved pairs of 200-step
runs with Argus off (the NoOp tracer: the baseline) and on (host clock, file sink, shipper
thread); ``overhead_pct`` is the median of the pairs' differences, with its spread. Then one
continuous 10,000-step run with Argus on: ``self_us_per_step`` is the exporter's own CPU time
(training-thread hooks plus its shipper thread, from thread CPU clocks) per step and
``rss_growth_mb`` the resident memory growth from step 1,000 to the end. Last, the training
thread's cost of timing one collective (``argus_exporters.collectives``), on a real one-rank
gloo process group: interleaved pairs of 2,000 ``dist.all_reduce`` calls (sync, and async
then waited) with the hooks uninstalled (the baseline) and installed;
``collective_*_overhead_cpu_us`` is the median of the pairs' differences in the training
thread's CPU time per call (its wall time is dominated by gloo's hand-off to its worker
thread, tens of us that vary more than the hooks cost).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a deterministic, one-core stand-in step
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from _report import report

from argus_exporters.clock import HostClock
from argus_exporters.config import Settings
from argus_exporters.identity import RankIdentity
from argus_exporters.tracer import NoOpTracer, Tracer

PHASES = ("forward", "backward", "dp-allreduce", "optimizer")


def rss_mb() -> float:
    """Resident set size of this process in MiB (Linux)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def loop(tracer, steps: int, work: np.ndarray) -> tuple[float, float, float]:
    """Run the stand-in job; returns (seconds, rss at step 1,000, rss at the end)."""
    rss_warm = 0.0
    t0 = time.perf_counter()
    for i in range(steps):
        for name in PHASES:
            with tracer.phase(name):
                np.dot(work, work)
        tracer.step()
        if i == 1000:
            rss_warm = rss_mb()
    return time.perf_counter() - t0, rss_warm, rss_mb()


def make_tracer(spool: str) -> Tracer:
    """Argus on, as in a training image: file sink, host clock, metrics collector."""
    settings = Settings(enabled=True, sink=f"file://{spool}", flush_s=0.5)
    identity = RankIdentity("bench", 0, 1, 0, "localhost", {"dp": 0, "tp": 0, "pp": 0, "ep": 0})
    return Tracer(settings, identity, clock=HostClock())


def collective_cost(pairs: int, calls: int = 2000) -> dict:
    """Per-call cost of the collective hooks against the same calls unhooked, same run."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return {}
    from argus_exporters import collectives

    with tempfile.TemporaryDirectory() as spool:
        dist.init_process_group("gloo", init_method=f"file://{spool}/pg", rank=0,
                                world_size=1)
        tracer = make_tracer(spool)
        tensor = torch.ones(4)

        def run(async_op: bool) -> tuple[float, float]:
            """Per call: the training thread's CPU time and wall time, in us."""
            t0, c0 = time.perf_counter(), time.thread_time()
            for i in range(calls):
                work = dist.all_reduce(tensor, async_op=async_op)
                if async_op:
                    work.wait()
                if i % 20 == 19:
                    tracer.step()
            return ((time.thread_time() - c0) / calls * 1e6,
                    (time.perf_counter() - t0) / calls * 1e6)

        out = {}
        for async_op in (False, True):
            run(async_op)  # warm
            cpu, wall, bases = [], [], []
            for _ in range(pairs):
                collectives.uninstall()
                base = run(async_op)
                collectives.install(tracer)
                hooked = run(async_op)
                cpu.append(hooked[0] - base[0])
                wall.append(hooked[1] - base[1])
                bases.append(base)
            kind = "async" if async_op else "sync"
            out[f"collective_{kind}_baseline_cpu_us"] = float(np.median([b[0] for b in bases]))
            out[f"collective_{kind}_baseline_wall_us"] = float(np.median([b[1] for b in bases]))
            out[f"collective_{kind}_overhead_cpu_us"] = float(np.median(cpu))
            out[f"collective_{kind}_overhead_cpu_us_iqr"] = [float(np.percentile(cpu, 25)),
                                                            float(np.percentile(cpu, 75))]
            out[f"collective_{kind}_overhead_wall_us"] = float(np.median(wall))
        collectives.uninstall()
        tracer.shutdown()
        dist.destroy_process_group()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = np.random.default_rng(0).random((200, 200))
    loop(NoOpTracer(), 300, work)  # warm caches
    with tempfile.TemporaryDirectory() as spool:
        tracer = make_tracer(spool)
        diffs, bases = [], []
        for _ in range(args.pairs):
            base_s, _, _ = loop(NoOpTracer(), 200, work)
            on_s, _, _ = loop(tracer, 200, work)
            diffs.append((on_s - base_s) / base_s * 100)
            bases.append(base_s / 200 * 1e3)
        tracer.shutdown()
    with tempfile.TemporaryDirectory() as spool:
        tracer = make_tracer(spool)
        on_s, rss_warm, rss_end = loop(tracer, args.steps, work)
        tracer.shutdown()
        list(tracer.metrics.collect())  # one scrape's worth of work
    health = tracer.health
    result = {"steps": args.steps, "baseline_step_ms": float(np.median(bases)),
              "overhead_pct": float(np.median(diffs)),
              "overhead_pct_iqr": [float(np.percentile(diffs, 25)),
                                   float(np.percentile(diffs, 75))],
              "self_us_per_step": health.cpu_seconds / args.steps * 1e6,
              "self_pct_of_step": health.cpu_seconds / on_s * 100,
              "rss_warm_mb": rss_warm, "rss_end_mb": rss_end,
              "rss_growth_mb": rss_end - rss_warm, "records_shipped": health.records_shipped,
              "dropped": dict(health.dropped), **collective_cost(args.pairs)}
    report(result, args.json)


if __name__ == "__main__":
    main()
