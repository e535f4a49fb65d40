"""Benchmark: the smallest fault found reliably (>= 95% of seeds), by kind, scale and noise.

    python bench/fault_sweep.py [--json] [--scales 8,64,512] [--seeds 20] [--steps 20]

Simulated jobs with the heterogeneity real ones have (2% rank spread, clocks offset by a few
ms, MoE-like expert jitter, heavier first and last pipeline stages), diagnosed end to end:

- compute: one rank's forward and backward compute slower by 1.15x .. 3x from step 8 on;
  found = that rank's verdict is compute;
- host: one rank's host stalls before two steps for 0.25x .. 3x the step time (a JIT stall;
  the step time is measured on a healthy run of the same scale); found = that rank's verdict
  is host;
- link: one TP group's collectives slower by 1.3x .. 5x; found = every member's verdict is
  communication;
- tail: a tenth of one rank's backward dgrad GEMM executions slower, so that the kernel costs
  it 10% .. 50% more time (the size) while its median does not move; found = that rank's
  verdict is compute. Tail cells run --tail-steps (60) steps: a tail shows only in enough
  executions (a real 60 s window holds hundreds of steps).

at 8 ranks (dp=4, tp=2), 16 (dp=8, tp=2), 64 (dp=8, tp=4, pp=2) and 512 (dp=32, tp=8, pp=2;
--scales picks them, 8,64,512 by default), with kernel noise 1x,
2x and 3x the default 3%. ``false_verdict_runs`` counts runs where any other rank got a verdict.
With ``--step-noise real-cpu`` every job also carries the step-level noise fitted to the real
CPU jobs (``argus_core.simulate.REAL_CPU``: per-step jitter, drift, blips) and, as those jobs,
step records only (no kernels: link and tail faults, which only kernels show, are skipped).
``found_or_minor`` also counts faulty ranks found but listed as minor (costing the job less
than ``verdict.min_cost_share`` of its step). The last line (--json) holds every cell and
``smallest``: per kind, scale and noise, the
smallest size from which every larger size is found in >= 95% of seeds (null: none).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import numpy as np
from _report import report

from argus_core.detect.diagnose import diagnose
from argus_core.simulate import REAL_CPU, SimConfig, parse_fault, simulate_trace
from argus_core.topology import Topology

SCALES = {8: "dp=4,tp=2", 16: "dp=8,tp=2", 64: "dp=8,tp=4,pp=2", 512: "dp=32,tp=8,pp=2"}
SIZES = {"compute": (1.15, 1.2, 1.3, 1.5, 2.0, 3.0), "host": (0.25, 0.5, 1.0, 1.5, 2.0, 3.0),
         "link": (1.3, 1.5, 2.0, 3.0, 5.0), "tail": (0.1, 0.2, 0.3, 0.5)}
TAIL_SHARE = 0.1
TAIL_STEPS = 60
NOISE = (1, 2, 3)
REALISTIC = dict(rank_spread=0.02, clock_offset_s=0.003, clock_jitter_s=0.002,
                 count_jitter=0.05, unequal_stages=True, kernel_every=2)


@functools.cache
def step_seconds(topology: Topology) -> float:
    """The median iteration time of a healthy job of this scale."""
    trace = simulate_trace(SimConfig(topology=topology, steps=6, **REALISTIC))
    return float(np.median(trace.steps.wall_s))


def fault_for(kind: str, size: float, topology: Topology) -> tuple[str, set[int], str]:
    """(fault spec, ranks that must get the verdict, the verdict) for one cell."""
    world = topology.world_size
    rank = world // 3
    if kind == "compute":
        return (f"compute:ranks={rank}:phases=attention*{size},mlp*{size},backward*{size}"
                f":from=8"), {rank}, "compute"
    if kind == "tail":
        factor = 1 + size / TAIL_SHARE
        return (f"tail:ranks={rank}:kernel=dgrad:share={TAIL_SHARE}:factor={factor:g}:from=0",
                {rank}, "compute")
    if kind == "host":
        seconds = size * step_seconds(topology)
        return f"stall:ranks={rank}:steps=9,15:seconds={seconds:.4f}", {rank}, "host"
    coords = topology.coords()
    group = np.flatnonzero((coords[:, [0, 2, 3]] == coords[rank, [0, 2, 3]]).all(axis=1))
    axis = "tp" if topology.tp > 1 else "dp"
    if axis == "dp":
        group = np.arange(world)
    spec = f"link:ranks={','.join(map(str, group.tolist()))}:axis={axis}:factor={size}"
    return spec, set(group.tolist()), "communication"


def run_cell(kind: str, size: float, scale: int, noise: int, seeds: int, steps: int,
             real_noise: bool = False, kernel_every: int = REALISTIC["kernel_every"]) -> dict:
    """Hit rate and false verdicts of one (kind, size, scale, noise) over seeded jobs
    (``real_noise``: with REAL_CPU step noise and step records only; ``kernel_every``: the
    kernel probe's duty, kernels recorded in 1 step of it)."""
    topology = Topology.parse(SCALES[scale])
    spec, ranks, cause = fault_for(kind, size, topology)
    hits = minor_hits = false_runs = 0
    for seed in range(seeds):
        config = SimConfig(topology=topology, steps=steps, noise=0.03 * noise,
                           seed=seed * 7919 + scale, faults=(parse_fault(spec),),
                           **{**REALISTIC, "kernel_every": kernel_every},
                           **({"step_noise": REAL_CPU} if real_noise else {}))
        trace = simulate_trace(config)
        if real_noise:
            trace = dataclasses.replace(trace, kernels=trace.kernels.take(
                np.zeros(len(trace.kernels), dtype=bool)))
        doc = diagnose(trace).to_json()
        verdicts = {v["rank"]: v["cause"] for v in doc["verdict"]}
        minor = {v["rank"]: v["cause"] for v in doc["minor"]}
        hits += all(verdicts.get(r) == cause for r in ranks)
        minor_hits += all(verdicts.get(r, minor.get(r)) == cause for r in ranks)
        false_runs += any(r not in ranks for r in verdicts)
    return {"kind": kind, "size": size, "scale": scale, "noise": noise, "seeds": seeds,
            "traced_steps": len(range(0, steps, kernel_every)), "found": hits / seeds,
            "found_or_minor": minor_hits / seeds, "false_verdict_runs": false_runs}


def smallest(cells: list[dict], kind: str, scale: int, noise: int) -> float | None:
    """Smallest size from which every larger size was found in >= 95% of seeds."""
    rows = sorted((c for c in cells if (c["kind"], c["scale"], c["noise"]) == (kind, scale,
                                                                                noise)),
                  key=lambda c: c["size"])
    best = None
    for row in reversed(rows):
        if row["found"] < 0.95:
            break
        best = row["size"]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="8,64,512")
    parser.add_argument("--kinds", default="compute,host,link")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tail-steps", type=int, default=TAIL_STEPS)
    parser.add_argument("--step-noise", choices=("none", "real-cpu"), default="none")
    parser.add_argument("--noises", default=",".join(map(str, NOISE)),
                        help="kernel noise levels, multiples of the default 3%%")
    parser.add_argument("--kernel-every", type=int, default=REALISTIC["kernel_every"],
                        help="the kernel probe's duty: kernels recorded in 1 step of N")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scales = [int(s) for s in args.scales.split(",")]
    kinds = args.kinds.split(",")
    real_noise = args.step_noise == "real-cpu"
    noises = [int(n) for n in args.noises.split(",")]
    if real_noise:
        kinds = [k for k in kinds if k not in ("link", "tail")]
    t0 = time.perf_counter()
    cells = []
    for scale in scales:
        for kind in kinds:
            for noise in noises:
                for size in SIZES[kind]:
                    steps = args.tail_steps if kind == "tail" else args.steps
                    cells.append(run_cell(kind, size, scale, noise, args.seeds, steps,
                                          real_noise, args.kernel_every))
                    if not args.json:
                        c = cells[-1]
                        print(f"{kind:8} {scale:4} ranks noise {noise}x size {size:5}: found "
                              f"{c['found']:.2f}, false-verdict runs {c['false_verdict_runs']}",
                              flush=True)
    result = {"seeds": args.seeds, "steps": args.steps, "tail_steps": args.tail_steps,
              "step_noise": args.step_noise, "kernel_every": args.kernel_every,
              "seconds": time.perf_counter() - t0,
              "step_seconds": {str(s): round(step_seconds(Topology.parse(SCALES[s])), 4)
                               for s in scales},
              "smallest": {kind: {str(scale): {str(noise): smallest(cells, kind, scale, noise)
                                               for noise in noises} for scale in scales}
                           for kind in kinds},
              "false_verdict_runs": sum(c["false_verdict_runs"] for c in cells),
              "runs": sum(c["seeds"] for c in cells), "cells": cells}
    if not args.json:
        del result["cells"]  # printed line by line above
    report(result, args.json)


if __name__ == "__main__":
    main()
