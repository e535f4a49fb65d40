"""GPU check (prepared for the H200 device): Argus overhead on the paper's two workloads.

    python bench/gpu_overhead.py [--pairs 12] [--steps 30] [--json]

Launch-heavy: eager MLP of 48 x (Linear(512) + GELU), bf16, 8 x 256 tokens. GEMM-heavy:
8 x Linear(4096), bf16, 8,192 tokens. Each step is forward, backward and an AdamW step. In one
process, interleaved pairs of segments run with Argus off (no hooks, CUPTI paused) and with
everything on (phase hooks on CUDA events, CUPTI kernels every step, py-spy stacks, metrics,
file sink), timed with a device synchronise at segment edges only. Also measured, in the same
pairs: phases alone (semantics events), for comparison with the paper's ~1%. Reports the
median overhead per mode with its spread. Targets: <= 2% launch-heavy, <= 1% GEMM-heavy.
Needs CUDA; on a machine without it prints a JSON error and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import numpy as np
from _report import report


def build(torch, kind: str):
    """(model, optimizer, input) of one workload on the GPU."""
    if kind == "launch_heavy":
        layers = [m for _ in range(48) for m in (torch.nn.Linear(512, 512), torch.nn.GELU())]
        x = torch.randn(8 * 256, 512)
    else:
        layers = [torch.nn.Linear(4096, 4096) for _ in range(8)]
        x = torch.randn(8192, 4096)
    model = torch.nn.Sequential(*layers).cuda().to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, optimizer, x.cuda().to(torch.bfloat16)


def run_steps(torch, model, optimizer, x, steps: int) -> float:
    """Seconds for ``steps`` training steps, synchronised at both ends only."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print(json.dumps({"error": "torch is not installed"}))
        return 2
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device: run this on the GPU machine"}))
        return 2

    from argus_exporters import hooks
    from argus_exporters.clock import CudaClock
    from argus_exporters.config import Settings
    from argus_exporters.identity import RankIdentity
    from argus_exporters.kernels import KernelProbe
    from argus_exporters.metrics import serve
    from argus_exporters.stacks import StackProbe
    from argus_exporters.tracer import Tracer

    spool = tempfile.mkdtemp(prefix="argus-gpu-")
    settings = Settings(enabled=True, sink=f"file://{spool}", kernels=True, stacks=True,
                        stack_period_s=1.0, extra={"training_rank": True})
    identity = RankIdentity("gpu-overhead", 0, 1, 0, "device", {"dp": 0, "tp": 0, "pp": 0,
                                                                  "ep": 0})
    tracer = Tracer(settings, identity, clock=CudaClock(torch))
    kernels = KernelProbe(settings, identity, tracer.emit, tracer.health)
    stacks = StackProbe(settings, identity, tracer.emit, tracer.health)
    probes = {"kernels": kernels.start(), "stacks": stacks.start()}
    server = serve(tracer.metrics, 9464, "127.0.0.1", tracer.health)
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "probes": probes, "pairs": args.pairs, "steps_per_segment": args.steps}
    for kind in ("launch_heavy", "gemm_heavy"):
        model, optimizer, x = build(torch, kind)
        run_steps(torch, model, optimizer, x, 20)  # warm-up: allocator, cuBLAS, autotune
        rows = {"all_on": [], "phases_only": []}
        base_step = []
        for _ in range(args.pairs):
            for mode in rows:
                off = run_steps(torch, model, optimizer, x, args.steps)
                handles = hooks.instrument(model, optimizer, tracer)
                if mode == "all_on" and probes["kernels"]:
                    kernels.step_begin(0)
                    tracer.probes = [_Steps(kernels)]
                on = run_steps(torch, model, optimizer, x, args.steps)
                for handle in handles:
                    handle.remove()
                tracer.probes = []
                kernels.pause()
                rows[mode].append((on - off) / off * 100)
                base_step.append(off / args.steps * 1e3)
        result[kind] = {"step_ms": float(np.median(base_step)),
                        **{f"{mode}_overhead_pct": _spread(v) for mode, v in rows.items()}}
        del model, optimizer, x
        torch.cuda.empty_cache()
    tracer.shutdown()
    kernels.shutdown()
    stacks.shutdown()
    if server is not None:
        server.shutdown()
    result["exporter_cpu_s"] = tracer.health.cpu_seconds
    result["dropped"] = dict(tracer.health.dropped)
    result["records_shipped"] = tracer.health.records_shipped
    report(result, args.json)
    return 0


class _Steps:
    """Per-step callback for the kernel probe (as argus_exporters.start wires it)."""

    def __init__(self, probe):
        self.probe = probe

    def on_step(self, step: int, wall_s: float) -> None:
        self.probe.step_end(step)
        self.probe.step_begin(step + 1)

    def shutdown(self, timeout: float) -> None:
        pass


def _spread(values: list[float]) -> dict:
    return {"median": float(np.median(values)), "p25": float(np.percentile(values, 25)),
            "p75": float(np.percentile(values, 75)), "min": float(min(values)),
            "max": float(max(values))}


if __name__ == "__main__":
    sys.exit(main())
