"""A synthetic synchronous training job that emits schema-v1 records.

Each step every rank runs the same kernel sequence: attention and MLP forward, TP collectives,
EP all-to-all, backward, PP send/recv, DP all-reduce, optimizer. Collectives are synchronous:
a rank that arrives early waits inside the collective for the last member, so its NCCL kernel
and its communication phase grow by the wait, as on real hardware, and the late rank's are
short. A collective runs at the speed of the slowest link in its group. Ranks differ by a small
persistent speed factor; kernels and steps jitter log-normally. All ranks are generated at once
per step with numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from argus_core.schema import AXES, coords_dict
from argus_core.simulate.faults import Fault
from argus_core.topology import Topology, axis_groups

COMPUTE_STREAM = 7
COMM_STREAM = {"dp": 13, "tp": 14, "pp": 15, "ep": 16}
COMM_PHASE = {"tp": "tp-comm", "ep": "ep-alltoall", "pp": "pp-p2p", "dp": "dp-allreduce"}
# Order of the phases within a step; axis names stand for that axis's collective.
STEP_ORDER = ("attention", "mlp", "tp", "ep", "backward", "pp", "dp", "optimizer")
GPUS_PER_NODE = 8
JOB_EPOCH_NS = 1_790_000_000_000_000_000  # 2026-09-21, a fixed start keeps runs reproducible

# (name, phase or axis, base duration in microseconds, executions per step)
KERNELS = (
    ("sm90_xmma_gemm_bf16_qkv_proj", "attention", 1800, 4),
    ("flash_fwd_kernel", "attention", 2500, 4),
    ("layer_norm_fwd_kernel", "attention", 120, 8),
    ("sm90_xmma_gemm_bf16_mlp_fc1", "mlp", 3600, 4),
    ("gelu_fwd_kernel", "mlp", 300, 4),
    ("sm90_xmma_gemm_bf16_mlp_fc2", "mlp", 3600, 4),
    ("ncclDevKernel_AllGather_RING_LL", "tp", 400, 4),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "tp", 450, 4),
    ("ncclDevKernel_AllToAll_RING_LL", "ep", 800, 4),
    ("sm90_xmma_gemm_bf16_dgrad", "backward", 3800, 8),
    ("sm90_xmma_gemm_bf16_wgrad", "backward", 3700, 8),
    ("flash_bwd_dq_dk_dv_kernel", "backward", 6000, 4),
    ("vectorized_elementwise_bwd", "backward", 250, 12),
    ("ncclDevKernel_SendRecv", "pp", 300, 4),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "dp", 6000, 2),  # two bucket sizes:
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "dp", 600, 1),  # one name, bimodal
    ("multi_tensor_apply_adam_kernel", "optimizer", 1500, 4),
)


@dataclass(frozen=True)
class SimConfig:
    """What to simulate."""

    job: str = "sim"
    topology: Topology = field(default_factory=lambda: Topology(dp=8))
    steps: int = 40
    noise: float = 0.03  # log-normal jitter of each kernel
    rank_spread: float = 0.01  # persistent per-rank speed differences (log-normal)
    host_overhead_s: float = 0.004  # host time per step outside GPU work
    faults: tuple[Fault, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        world = self.topology.world_size
        for fault in self.faults:
            bad = [r for r in fault.ranks if not 0 <= r < world]
            if bad:
                raise ValueError(f"fault {fault}: rank {bad[0]} outside world size {world}")
            if fault.kind == "link" and fault.axis not in AXES:
                raise ValueError(f"fault {fault}: axis must be one of {', '.join(AXES)}")
            phases = [p for p in STEP_ORDER if p not in COMM_STREAM]
            unknown = [p for p in fault.phases if p not in phases]
            if unknown:
                raise ValueError(f"fault {fault}: unknown phase {unknown[0]!r} "
                                 f"(phases: {', '.join(phases)})")
            factors = [*fault.phases.values(), *fault.ops.values(), fault.factor]
            if fault.kind != "stall" and min(factors) <= 0:
                raise ValueError(f"fault {fault}: slowdown factors must be > 0")
            if fault.kind == "stall" and fault.seconds < 0:
                raise ValueError(f"fault {fault}: stall seconds must be >= 0")


@dataclass
class _Layout:
    """The kernel instances of one step, in execution order."""

    names: list[str]
    name: np.ndarray  # index into names, per instance
    stream: np.ndarray
    slot: np.ndarray  # index into STEP_ORDER
    base_ns: np.ndarray


def _layout(topology: Topology) -> _Layout:
    names: list[str] = []
    name, stream, slot, base = [], [], [], []
    for slot_index, part in enumerate(STEP_ORDER):
        if part in COMM_STREAM and getattr(topology, part) == 1:
            continue  # no collective on an axis of size 1
        for kernel, where, base_us, count in KERNELS:
            if where != part:
                continue
            if kernel not in names:
                names.append(kernel)
            name += [names.index(kernel)] * count
            stream += [COMM_STREAM.get(part, COMPUTE_STREAM)] * count
            slot += [slot_index] * count
            base += [base_us * 1000.0] * count
    return _Layout(names, np.array(name, dtype=np.int32), np.array(stream, dtype=np.int64),
                   np.array(slot), np.array(base))


def simulate(config: SimConfig) -> Iterator[tuple[int, dict]]:
    """Yield (rank, record) pairs: identities first, then steps, kernels and stack samples."""
    rng = np.random.default_rng(config.seed)
    topo = config.topology
    world = topo.world_size
    coords = topo.coords()
    layout = _layout(topo)
    groups = {axis: axis_groups(coords, axis) for axis in COMM_STREAM}
    rank_speed = np.exp(rng.normal(0.0, config.rank_spread, world))
    for rank in range(world):
        yield rank, {"v": 1, "kind": "rank", "job": config.job, "rank": rank, "world_size": world,
                     "host": f"node-{rank // GPUS_PER_NODE}", "local_rank": rank % GPUS_PER_NODE,
                     "coords": coords_dict(coords[rank])}
    step_start = JOB_EPOCH_NS
    for step in range(config.steps):
        dur, phases, gpu, stall, offsets = _step(config, layout, groups, rank_speed, step, rng)
        end = stall + gpu
        wall = end.max() + config.host_overhead_s * np.exp(rng.normal(0, 0.05))
        for rank in range(world):
            start = step_start + int(stall[rank] * 1e9)
            yield rank, {"v": 1, "kind": "step", "job": config.job, "rank": rank, "step": step,
                         "t_ns": step_start,
                         "wall_s": round(float(wall + rng.normal(0, 2e-4)), 6),
                         "gpu_s": round(float(gpu[rank]), 6),
                         "phases": {k: round(float(v[rank]), 6) for k, v in phases.items()}}
            yield rank, {"v": 1, "kind": "kernels", "job": config.job, "rank": rank,
                         "names": layout.names, "name": layout.name, "stream": layout.stream,
                         "start_ns": start + offsets[rank], "dur_ns": dur[rank]}
            stalled = stall[rank] > 0
            if stalled or step % 10 == 0:
                yield rank, _stack(config.job, rank, start, stalled)
        step_start += int(wall * 1e9)


def retimed(records: Iterator[tuple[int, dict]], start_ns: int,
            scale: float = 1.0) -> Iterator[tuple[int, dict]]:
    """The records of :func:`simulate` moved to start at ``start_ns`` instead of
    :data:`JOB_EPOCH_NS`, every duration multiplied by ``scale``: a simulated job that ran
    at a chosen time (a processor refuses records a day older than its clock)."""
    def at(t_ns):
        return start_ns + ((t_ns - JOB_EPOCH_NS) * scale).astype("int64") \
            if hasattr(t_ns, "astype") else start_ns + int((t_ns - JOB_EPOCH_NS) * scale)

    for rank, record in records:
        kind = record["kind"]
        if kind == "step":
            record = {**record, "t_ns": at(record["t_ns"]), "wall_s": record["wall_s"] * scale,
                      "gpu_s": record["gpu_s"] * scale,
                      "phases": {k: v * scale for k, v in record["phases"].items()}}
        elif kind == "kernels":
            record = {**record, "start_ns": at(record["start_ns"]),
                      "dur_ns": (record["dur_ns"] * scale).astype("int64")}
        elif kind == "stack":
            record = {**record, "t_ns": at(record["t_ns"])}
        yield rank, record


def _step(config: SimConfig, layout: _Layout, groups: dict[str, np.ndarray],
          rank_speed: np.ndarray, step: int, rng: np.random.Generator):
    """Kernel durations (ns) and phase times (s) of every rank for one step."""
    world = len(rank_speed)
    jitter = np.exp(rng.normal(0.0, config.noise, (world, len(layout.base_ns))))
    dur = layout.base_ns * rank_speed[:, None] * jitter * np.exp(rng.normal(0.0, 0.01))
    stall = np.zeros(world)
    for fault in config.faults:
        ranks = list(fault.ranks)
        if fault.kind == "compute" and fault.active(step):
            for phase, factor in fault.phases.items():
                cols = layout.slot == STEP_ORDER.index(phase)
                dur[np.ix_(ranks, np.flatnonzero(cols))] *= factor
        elif fault.kind == "link" and fault.active(step):
            cols = np.flatnonzero(layout.slot == STEP_ORDER.index(fault.axis))
            factor = np.array([_op_factor(fault, layout.names[layout.name[c]]) for c in cols])
            dur[np.ix_(ranks, cols)] *= factor
        elif fault.kind == "stall" and step in fault.steps:
            stall[ranks] += fault.seconds

    phases: dict[str, np.ndarray] = {}
    clock = stall.copy()  # seconds since the step started, per rank
    for slot_index, part in enumerate(STEP_ORDER):
        cols = np.flatnonzero(layout.slot == slot_index)
        if len(cols) == 0:
            continue
        if part not in COMM_STREAM:
            phases[part] = dur[:, cols].sum(axis=1) * 1e-9
            clock = clock + phases[part]
            continue
        # A collective: it starts when its last member arrives and runs at its slowest link.
        gid = groups[part]
        group_dur = np.zeros((gid.max() + 1, len(cols)))
        np.maximum.at(group_dur, gid, dur[:, cols])
        dur[:, cols] = group_dur[gid]
        last_arrival = np.zeros(gid.max() + 1)
        np.maximum.at(last_arrival, gid, clock)
        wait = last_arrival[gid] - clock
        dur[:, cols[0]] += wait * 1e9  # the first kernel spins until everyone is there
        phases[COMM_PHASE[part]] = dur[:, cols].sum(axis=1) * 1e-9
        clock = clock + phases[COMM_PHASE[part]]
    dur = np.maximum(dur, 1.0).astype(np.int64)
    offsets = np.zeros_like(dur)
    np.cumsum(dur[:, :-1], axis=1, out=offsets[:, 1:])
    return dur, phases, clock - stall, stall, offsets


def _op_factor(fault: Fault, kernel: str) -> float:
    for op, factor in fault.ops.items():
        if op in kernel:
            return factor
    return fault.factor


def _stack(job: str, rank: int, t_ns: int, stalled: bool) -> dict:
    frames = ["train.py:<module>:212", "train.py:main:180", "train.py:train_step:96"]
    if stalled:
        frames += ["flash_attn/cute/interface.py:_flash_attn_bwd:512",
                   "cutlass/cute/compiler.py:compile:88",
                   "cutlass/base_dsl/jit.py:_jit_compile:301"]
    else:
        frames += ["torch/_tensor.py:backward:626",
                   "torch/autograd/graph.py:_engine_run_backward:823"]
    return {"v": 1, "kind": "stack", "job": job, "rank": rank, "t_ns": t_ns,
            "thread": "MainThread", "frames": frames}
