"""A synthetic synchronous training job that emits schema-v1 records, or a columnar Trace.

Each step every rank runs the same kernel sequence: attention and MLP forward, TP collectives,
EP all-to-all, backward, PP send/recv, DP all-reduce, optimizer. Collectives are synchronous:
a rank that arrives early waits inside the collective for the last member, so its NCCL kernel
and its communication phase grow by the wait, as on real hardware, and the late rank's are
short. A collective runs at the speed of the slowest link in its group. All ranks are
generated at once per step with numpy.

What real jobs do and the simulator can reproduce (all off by default, see ``SimConfig``):
persistent rank-to-rank speed differences (``rank_spread``), per-rank clocks with offsets and
per-step jitter of the host's step start, which leads the device's by a random few ms
(``clock_offset_s``, ``clock_jitter_s``: every ``t_ns`` and ``start_ns`` of a rank is on its
own clock), MoE-like routing jitter (expert
kernels' executions and load vary per rank and step, ``count_jitter``), and pipeline stages
with unequal work (the first stage embeds, the last computes the LM head and the loss,
``unequal_stages``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from argus_core.schema import AXES, RankRecord, StackRecord, coords_dict
from argus_core.simulate.faults import Fault
from argus_core.simulate.noise import NoiseModel
from argus_core.simulate.placement import Hardware
from argus_core.topology import Topology, axis_groups
from argus_core.trace import KernelTable, StepTable, Trace

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
# Extra work of the first pipeline stage (embedding) and the last (LM head and loss), with
# ``unequal_stages``: (name, phase, microseconds, executions, stage: "first" or "last").
STAGE_KERNELS = (
    ("embedding_fwd_kernel", "attention", 1500, 1, "first"),
    ("embedding_bwd_kernel", "backward", 2500, 1, "first"),
    ("sm90_xmma_gemm_bf16_lm_head", "mlp", 4000, 2, "last"),
    ("cross_entropy_fwd_kernel", "mlp", 800, 1, "last"),
    ("sm90_xmma_gemm_bf16_lm_head_dgrad", "backward", 4000, 2, "last"),
    ("cross_entropy_bwd_kernel", "backward", 800, 1, "last"),
)
MOE_PHASE = "mlp"  # the expert kernels whose executions and load follow the routing


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
    clock_offset_s: float = 0.0  # sd of each rank's clock offset (t_ns and start_ns)
    clock_jitter_s: float = 0.0  # sd of how far each host step start leads the device's
    count_jitter: float = 0.0  # expert kernels: share dropped and log-sd of load, per step
    unequal_stages: bool = False  # first and last pipeline stages do extra work
    kernel_every: int = 1  # kernels recorded in 1 step of N (ARGUS_KERNEL_DUTY)
    step_noise: NoiseModel = field(default_factory=NoiseModel)  # real jobs' step-level noise
    hardware: Hardware | None = None  # where ranks run (placement); None: 8 ranks a host only

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.kernel_every < 1:
            raise ValueError(f"kernel_every must be >= 1, got {self.kernel_every}")
        for name in ("noise", "rank_spread", "clock_offset_s", "clock_jitter_s",
                     "count_jitter", "host_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.count_jitter >= 0.5:
            raise ValueError(f"count_jitter must be < 0.5, got {self.count_jitter}")
        world = self.topology.world_size
        parts = [p for p in STEP_ORDER if p not in COMM_STREAM]
        for fault in self.faults:
            bad = [r for r in fault.ranks if not 0 <= r < world]
            if bad:
                raise ValueError(f"fault {fault}: rank {bad[0]} outside world size {world}")
            if fault.kind == "link" and fault.axis not in AXES:
                raise ValueError(f"fault {fault}: axis must be one of {', '.join(AXES)}")
            unknown = [p for p in fault.phases if p not in parts]
            if unknown:
                raise ValueError(f"fault {fault}: unknown phase {unknown[0]!r} "
                                 f"(phases: {', '.join(parts)})")
            known = [k[0] for k in (*KERNELS, *STAGE_KERNELS)]
            if fault.kind == "tail" and not any(fault.kernel in name for name in known):
                raise ValueError(f"fault {fault}: no kernel name contains {fault.kernel!r}")
            if fault.kind == "stall" and fault.before and fault.before not in STEP_ORDER:
                raise ValueError(f"fault {fault}: before must be one of "
                                 f"{', '.join(STEP_ORDER)}")
            factors = [*fault.phases.values(), *fault.ops.values(), fault.factor]
            if fault.kind != "stall" and min(factors) <= 0:
                raise ValueError(f"fault {fault}: slowdown factors must be > 0")
            if fault.kind == "stall" and fault.seconds < 0:
                raise ValueError(f"fault {fault}: stall seconds must be >= 0")


@dataclass
class _Layout:
    """Every kernel instance a rank may run in one step, in execution order."""

    names: list[str]
    name: np.ndarray  # index into names, per instance
    stream: np.ndarray
    slot: np.ndarray  # index into STEP_ORDER
    base_ns: np.ndarray
    stage: np.ndarray  # -1: every stage; 0: first stage only; 1: last stage only


def _layout(topology: Topology, unequal_stages: bool) -> _Layout:
    rows = [(*k, -1) for k in KERNELS]
    if unequal_stages and topology.pp > 1:
        rows += [(n, p, us, c, 0 if where == "first" else 1)
                 for n, p, us, c, where in STAGE_KERNELS]
    names: list[str] = []
    name, stream, slot, base, stage = [], [], [], [], []
    for slot_index, part in enumerate(STEP_ORDER):
        if part in COMM_STREAM and getattr(topology, part) == 1:
            continue  # no collective on an axis of size 1
        for kernel, where, base_us, count, only in rows:
            if where != part:
                continue
            if kernel not in names:
                names.append(kernel)
            name += [names.index(kernel)] * count
            stream += [COMM_STREAM.get(part, COMPUTE_STREAM)] * count
            slot += [slot_index] * count
            base += [base_us * 1000.0] * count
            stage += [only] * count
    return _Layout(names, np.array(name, dtype=np.int32), np.array(stream, dtype=np.int64),
                   np.array(slot), np.array(base), np.array(stage))


@dataclass
class StepData:
    """One step of every rank, as arrays; kernel arrays are (ranks x instances)."""

    step: int
    t_ns: np.ndarray  # each rank's host start of the step, on its own clock
    wall_s: np.ndarray
    gpu_s: np.ndarray
    phases: dict[str, np.ndarray]
    start_ns: np.ndarray  # on each rank's own clock
    dur_ns: np.ndarray
    present: np.ndarray  # instance executed by the rank this step
    stalled: np.ndarray  # per rank: a host stall happened in this step


class _Job:
    """The fixed parts of a simulated job: topology, layout, rank speeds and clocks."""

    def __init__(self, config: SimConfig):
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        topo = config.topology
        self.world = topo.world_size
        self.coords = topo.coords()
        self.layout = _layout(topo, config.unequal_stages)
        self.groups = {axis: axis_groups(self.coords, axis) for axis in COMM_STREAM}
        self.rank_speed = np.exp(self.rng.normal(0.0, config.rank_spread, self.world))
        self.drift = np.zeros(self.world)  # each rank's log speed drift (step_noise)
        self.clock_offset_ns = (self.rng.normal(0.0, config.clock_offset_s, self.world)
                                * 1e9).astype(np.int64)
        pp = self.coords[:, AXES.index("pp")]
        stage = self.layout.stage
        self.present = ((stage[None, :] < 0) | ((stage[None, :] == 0) & (pp[:, None] == 0))
                        | ((stage[None, :] == 1) & (pp[:, None] == topo.pp - 1)))

    def rank_records(self) -> list[dict]:
        """The identity record of every rank."""
        if self.config.hardware is not None:
            return [{"v": 1, "kind": "rank", "job": info.job, "rank": info.rank,
                     "world_size": info.world_size, "host": info.host,
                     "local_rank": info.local_rank, "coords": coords_dict(info.coords),
                     "placement": info.placement}
                    for info in self.config.hardware.rank_records(self.config.job,
                                                                  self.config.topology).values()]
        return [{"v": 1, "kind": "rank", "job": self.config.job, "rank": rank,
                 "world_size": self.world, "host": f"node-{rank // GPUS_PER_NODE}",
                 "local_rank": rank % GPUS_PER_NODE, "coords": coords_dict(self.coords[rank])}
                for rank in range(self.world)]

    def steps(self) -> Iterator[StepData]:
        """Every step of the job, in order."""
        config, rng = self.config, self.rng
        step_start = JOB_EPOCH_NS
        for step in range(config.steps):
            dur, present, phases, gpu, stall, offsets = _step(self, step)
            end = stall + gpu
            wall = end.max() + config.host_overhead_s * np.exp(rng.normal(0, 0.05))
            # The host takes t_ns before it launches the step, so it can only lead the device.
            host_lead = (np.abs(rng.normal(0.0, config.clock_jitter_s, self.world)) * 1e9
                         ).astype(np.int64) if config.clock_jitter_s else 0
            t_ns = step_start + self.clock_offset_ns - host_lead
            device_start = step_start + self.clock_offset_ns + (stall * 1e9).astype(np.int64)
            yield StepData(step, t_ns, np.round(wall + rng.normal(0, 2e-4, self.world), 6),
                           np.round(gpu, 6), {k: np.round(v, 6) for k, v in phases.items()},
                           device_start[:, None] + offsets, dur, present,
                           _stalled(config, self.world, step))
            step_start += int(wall * 1e9)


def _stalled(config: SimConfig, world: int, step: int) -> np.ndarray:
    out = np.zeros(world, dtype=bool)
    for fault in config.faults:
        if fault.kind == "stall" and fault.active(step) and fault.seconds > 0:
            out[list(fault.ranks)] = True
    return out


def simulate(config: SimConfig) -> Iterator[tuple[int, dict]]:
    """Yield (rank, record) pairs: identities first, then steps, kernels and stack samples."""
    job = _Job(config)
    layout = job.layout
    for record in job.rank_records():
        yield record["rank"], record
    for data in job.steps():
        names = list(data.phases)
        for rank in range(job.world):
            yield rank, {"v": 1, "kind": "step", "job": config.job, "rank": rank,
                         "step": data.step, "t_ns": int(data.t_ns[rank]),
                         "wall_s": float(data.wall_s[rank]), "gpu_s": float(data.gpu_s[rank]),
                         "phases": {k: float(data.phases[k][rank]) for k in names}}
            keep = data.present[rank]
            if data.step % config.kernel_every == 0:
                yield rank, {"v": 1, "kind": "kernels", "job": config.job, "rank": rank,
                             "names": layout.names, "name": layout.name[keep],
                             "stream": layout.stream[keep],
                             "start_ns": data.start_ns[rank][keep],
                             "dur_ns": data.dur_ns[rank][keep]}
            if data.stalled[rank] or data.step % 10 == 0:
                yield rank, _stack(config.job, rank, int(data.t_ns[rank]), data.stalled[rank])


def simulate_trace(config: SimConfig) -> Trace:
    """The same job as ``simulate`` as a columnar Trace, built without any record objects.

    Fast enough for sweeps over hundreds of jobs; equal to reading ``simulate``'s records.
    """
    job = _Job(config)
    layout = job.layout
    ranks = {r["rank"]: RankRecord(config.job, r["rank"], job.world, r["host"], r["local_rank"],
                                   tuple(r["coords"][a] for a in AXES), r.get("placement", {}))
             for r in job.rank_records()}
    step_parts, kernel_parts, stacks = [], [], []
    names: list[str] = []
    for data in job.steps():
        names = list(data.phases)
        step_parts.append(data)
        rank, inst = np.nonzero(data.present)
        if data.step % config.kernel_every == 0:
                kernel_parts.append((rank, layout.name[inst], layout.stream[inst],
                                 data.start_ns[rank, inst], data.dur_ns[rank, inst]))
        for r in np.flatnonzero(data.stalled | (data.step % 10 == 0)).tolist():
            stacks.append(StackRecord(config.job, r, int(data.t_ns[r]), "MainThread",
                                      _frames(bool(data.stalled[r]))))
    world, n_steps = job.world, len(step_parts)
    # Rows ordered by (rank, step), as TraceBuilder orders them.
    steps = StepTable(
        rank=np.repeat(np.arange(world, dtype=np.int64), n_steps),
        step=np.tile(np.array([d.step for d in step_parts], dtype=np.int64), world),
        t_ns=np.stack([d.t_ns for d in step_parts], axis=1).ravel().astype(np.int64),
        wall_s=np.stack([d.wall_s for d in step_parts], axis=1).ravel(),
        gpu_s=np.stack([d.gpu_s for d in step_parts], axis=1).ravel(),
        phase_names=names,
        phases=np.stack([np.stack([d.phases[n] for n in names], axis=1) for d in step_parts],
                        axis=1).reshape(world * n_steps, len(names)))
    empty = np.zeros(0, dtype=np.int64)
    rank, name, stream, start, dur = (
        (np.concatenate(c) for c in zip(*kernel_parts, strict=True)) if kernel_parts
        else (empty,) * 5)
    kernels = KernelTable(rank.astype(np.int64), name.astype(np.int32), stream.astype(np.int64),
                          start.astype(np.int64), dur.astype(np.int64), list(layout.names))
    return Trace(config.job, ranks, steps, kernels, stacks)


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


def _step(job: _Job, step: int):
    """Kernel durations (ns) and phase times (s) of every rank for one step."""
    config, layout, rng = job.config, job.layout, job.rng
    world = job.world
    jitter = np.exp(rng.normal(0.0, config.noise, (world, len(layout.base_ns))))
    dur = layout.base_ns * job.rank_speed[:, None] * jitter * np.exp(rng.normal(0.0, 0.01))
    present = job.present.copy()
    if config.count_jitter > 0:
        expert = np.flatnonzero(layout.slot == STEP_ORDER.index(MOE_PHASE))
        load = np.exp(rng.normal(0.0, config.count_jitter, world))
        dur[:, expert] *= load[:, None]
        present[:, expert] &= rng.random((world, len(expert))) >= config.count_jitter
    stall = np.zeros(world)
    if config.step_noise.active:
        _step_noise(job, dur, stall)
    gap = np.zeros((world, len(STEP_ORDER)))  # host stalls inside the step: the device idles
    local_links = []
    for fault in config.faults:
        if not fault.active(step):
            continue
        ranks = list(fault.ranks)
        if fault.kind == "compute":
            for phase, factor in fault.phases.items():
                cols = layout.slot == STEP_ORDER.index(phase)
                dur[np.ix_(ranks, np.flatnonzero(cols))] *= factor
        elif fault.kind == "link" and fault.local:
            local_links.append(fault)
        elif fault.kind == "link":
            cols = np.flatnonzero(layout.slot == STEP_ORDER.index(fault.axis))
            factor = np.array([_op_factor(fault, layout.names[layout.name[c]]) for c in cols])
            dur[np.ix_(ranks, cols)] *= factor
        elif fault.kind == "tail":
            cols = np.flatnonzero([fault.kernel in layout.names[n] for n in layout.name])
            # ``share`` of the executions, spread evenly over the steps (and over any regular
            # subset of them, such as the traced ones): a golden-ratio sequence.
            k = step * len(cols) + np.arange(len(cols))
            hit = (k * 0.6180339887498949) % 1.0 < fault.share
            dur[np.ix_(ranks, cols)] *= np.where(hit, fault.factor, 1.0)[None, :]
        elif fault.kind == "stall" and fault.before:
            gap[ranks, STEP_ORDER.index(fault.before)] += fault.seconds
        elif fault.kind == "stall":
            stall[ranks] += fault.seconds
    dur = np.where(present, dur, 0.0)

    phases: dict[str, np.ndarray] = {}
    clock = stall.copy()  # seconds since the step started, per rank
    for slot_index, part in enumerate(STEP_ORDER):
        cols = np.flatnonzero(layout.slot == slot_index)
        if len(cols) == 0:
            continue
        clock = clock + gap[:, slot_index]
        if part not in COMM_STREAM:
            phases[part] = dur[:, cols].sum(axis=1) * 1e-9
            clock = clock + phases[part]
            continue
        # A collective: it starts when its last member arrives and runs at its slowest link.
        gid = job.groups[part]
        group_dur = np.zeros((gid.max() + 1, len(cols)))
        np.maximum.at(group_dur, gid, dur[:, cols])
        dur[:, cols] = group_dur[gid]
        for fault in local_links:
            if fault.axis == part:
                factor = np.array([_op_factor(fault, layout.names[layout.name[c]])
                                   for c in cols])
                dur[np.ix_(list(fault.ranks), cols)] *= factor
        last_arrival = np.zeros(gid.max() + 1)
        np.maximum.at(last_arrival, gid, clock)
        wait = last_arrival[gid] - clock
        dur[:, cols[0]] += wait * 1e9  # the first kernel spins until everyone is there
        phases[COMM_PHASE[part]] = dur[:, cols].sum(axis=1) * 1e-9
        clock = clock + phases[COMM_PHASE[part]]
    dur = np.maximum(dur, 1.0).astype(np.int64)
    offsets = np.zeros_like(dur)
    np.cumsum(np.where(present, dur, 0)[:, :-1], axis=1, out=offsets[:, 1:])
    idle_before = np.cumsum(gap, axis=1)[:, layout.slot] if gap.any() else 0.0
    offsets += (idle_before * 1e9).astype(np.int64) if gap.any() else 0
    return dur, present, phases, clock - stall, stall, offsets


def _step_noise(job: _Job, dur: np.ndarray, stall: np.ndarray) -> None:
    """A step of real jobs' noise, in place: every rank's compute scaled by its drift and this
    step's jitter; blips of at least 1.5x, half a host stall before the step, half compute."""
    noise, rng, layout = job.config.step_noise, job.rng, job.layout
    compute = np.array([STEP_ORDER[s] not in COMM_STREAM for s in layout.slot])
    rho = noise.drift_corr
    job.drift = rho * job.drift + np.sqrt(1 - rho ** 2) * rng.normal(0.0, noise.drift, job.world)
    scale = np.exp(job.drift + rng.normal(0.0, noise.step_jitter, job.world))
    blip = rng.random(job.world) < noise.blip_rate
    extra = np.where(blip, 0.5 + rng.exponential(max(noise.blip_excess, 1e-9), job.world), 0.0)
    on_host = blip & (rng.random(job.world) < 0.5)
    own_s = dur[:, compute].sum(axis=1) * 1e-9
    stall += np.where(on_host, extra * own_s, 0.0)
    scale *= np.where(blip & ~on_host, 1 + extra, 1.0)
    dur[:, compute] *= scale[:, None]


def _op_factor(fault: Fault, kernel: str) -> float:
    for op, factor in fault.ops.items():
        if op in kernel:
            return factor
    return fault.factor


def _frames(stalled: bool) -> list[str]:
    frames = ["train.py:<module>:212", "train.py:main:180", "train.py:train_step:96"]
    if stalled:
        return [*frames, "flash_attn/cute/interface.py:_flash_attn_bwd:512",
                "cutlass/cute/compiler.py:compile:88", "cutlass/base_dsl/jit.py:_jit_compile:301"]
    return [*frames, "torch/_tensor.py:backward:626",
            "torch/autograd/graph.py:_engine_run_backward:823"]


def _stack(job: str, rank: int, t_ns: int, stalled: bool) -> dict:
    return {"v": 1, "kind": "stack", "job": job, "rank": rank, "t_ns": t_ns,
            "thread": "MainThread", "frames": _frames(bool(stalled))}
