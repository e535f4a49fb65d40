"""GPU check: every collective timed on the stream it runs on (NCCL, CUDA events), one GPU.

    python bench/gpu_collectives.py [--out FILE] [--dry-run]

A one-rank NCCL process group on the GPU (gloo and the host clock with ``--dry-run``): steps
whose forward holds a synchronous all-reduce on the current stream (it must be taken out of
forward's time) and an all-gather issued on a side stream (it must not be), each 16 MiB.
Checks that the step records carry ``dp-allreduce`` and ``dp-allgather``, that forward's time
is its own work, and measures the training thread's CPU per collective with the hooks on
against the same calls unhooked (interleaved pairs; the issue's target is 5 us). One JSON
line (and ``--out``): ``ok``, ``phases_ms`` (medians), ``forward_ms``, ``checks``,
``collective_overhead_cpu_us``. Exit 0 when every check holds, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _gpu_env import default_out, ensure_argus_exporters, finish, no_gpu_reason, versions

ARGUS_FROM = ensure_argus_exporters()


def _step(torch, dist, tracer, model, x, buffers, side) -> None:
    with tracer.phase("forward"):
        y = model(x)
        dist.all_reduce(buffers[0])  # blocks the current stream: not forward's own time
        with torch.cuda.stream(side) if side is not None else _Nothing():
            dist.all_gather_into_tensor(buffers[1], buffers[2])  # its own stream
        y = model(y)
    tracer.step()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _cost(torch, dist, collectives, tracer, buffers, pairs: int, calls: int) -> list[float]:
    """Training-thread CPU per all-reduce, hooked minus unhooked, per pair (us)."""
    def run() -> float:
        c0 = time.thread_time()
        for i in range(calls):
            dist.all_reduce(buffers[3])
            if i % 20 == 19:
                tracer.step()
        return (time.thread_time() - c0) / calls * 1e6

    run()
    diffs = []
    for _ in range(pairs):
        collectives.uninstall()
        base = run()
        collectives.install(tracer)
        diffs.append(run() - base)
    return diffs


def main(argv: list[str] | None = None) -> int:
    """Run the checks; print (and write) one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--out", default=default_out("gpu_collectives.json"))
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, the host clock")
    args = parser.parse_args(argv)
    reason = None if args.dry_run else no_gpu_reason(need_cupti=False)
    if reason:
        return finish({"ok": False, "error": reason, "versions": versions()}, args.out, 2)
    import torch
    import torch.distributed as dist

    from argus_exporters import collectives
    from argus_exporters.clock import CudaClock, HostClock
    from argus_exporters.config import Settings
    from argus_exporters.identity import RankIdentity
    from argus_exporters.tracer import Tracer

    device = "cpu" if args.dry_run else "cuda"
    spool = Path(tempfile.mkdtemp(prefix="argus-gpu-coll-"))
    dist.init_process_group("gloo" if args.dry_run else "nccl",
                            init_method=f"file://{spool}/pg", rank=0, world_size=1)
    clock = HostClock() if args.dry_run else CudaClock(torch)
    identity = RankIdentity("gpu-collectives", 0, 1, 0, "device", {})
    records: list[dict] = []

    class Memory:
        """A sink that keeps the records (the check reads them back)."""

        def export(self, lines: list[bytes]) -> bool:
            import json

            records.extend(json.loads(line) for line in lines)
            return True

        def force_flush(self, timeout: float) -> bool:
            return True

        def shutdown(self) -> None:
            """Nothing to close."""

    tracer = Tracer(Settings(enabled=True, flush_s=0.1), identity, clock=clock, sink=Memory())
    collectives.install(tracer)
    n = 4 << 20  # 16 MiB of float32
    buffers = [torch.ones(n, device=device), torch.empty(n, device=device),
               torch.ones(n, device=device), torch.ones(16, device=device)]
    side = torch.cuda.Stream() if device == "cuda" else None
    model = torch.nn.Linear(1024, 1024, device=device)
    x = torch.randn(256, 1024, device=device)
    for _ in range(args.steps):
        _step(torch, dist, tracer, model, x, buffers, side)
    diffs = _cost(torch, dist, collectives, tracer, buffers, args.pairs, 200)
    collectives.uninstall()
    tracer.shutdown()
    dist.destroy_process_group()
    steps = [r for r in records if r.get("kind") == "step" and "forward" in r["phases"]][5:]
    names = sorted({k for s in steps for k in s["phases"]})
    phases_ms = {k: statistics.median(s["phases"].get(k, 0.0) * 1e3 for s in steps)
                 for k in names}
    checks = {"steps_recorded": len(steps) >= args.steps // 2,
              "collectives_recorded": {"dp-allreduce", "dp-allgather"} <= set(names),
              "forward_is_its_own_work": phases_ms.get("forward", 0.0) > 0.0
              and all(s["phases"]["forward"] <= s["gpu_s"] for s in steps)}
    result = {"ok": all(checks.values()), "dry_run": args.dry_run, "device": device,
              "argus_exporters": ARGUS_FROM, "versions": versions(), "checks": checks,
              "phases_ms": phases_ms, "collective_overhead_cpu_us": statistics.median(diffs),
              "collective_overhead_cpu_us_pairs": diffs}
    return finish(result, args.out, 0 if result["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
