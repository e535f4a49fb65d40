"""Steps of all ranks as dense (rank x step) matrices, the shape L1 and L2 work on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.trace import StepTable


@dataclass
class StepMatrix:
    """wall/gpu: (ranks x steps) seconds; phases: (ranks x steps x phases); NaN = not recorded.

    ``phase_names`` are in the order phases happen within a step. ``start_ns`` holds each
    rank's own start of each step (its clock; -1 where not recorded): ranks' clocks differ,
    so kernels are placed into steps rank by rank.
    """

    ranks: np.ndarray
    steps: np.ndarray
    t_ns: np.ndarray  # earliest recorded start of each step (for display and stack lookup)
    wall: np.ndarray
    gpu: np.ndarray
    phases: np.ndarray
    phase_names: list[str]
    start_ns: np.ndarray | None = None  # ranks x steps, int64, -1 = not recorded
    host_ns: np.ndarray | None = None  # ranks x steps: the host's step start (t_ns), -1 = none
    cpu_wait: np.ndarray | None = None  # ranks x steps: the training thread's wait for a CPU

    def phase(self, name: str) -> np.ndarray:
        """(ranks x steps) times of one phase."""
        return self.phases[:, :, self.phase_names.index(name)]


def step_start_ns(table: StepTable) -> np.ndarray:
    """When each step row's work started, on its rank's clock: the time base kernels are
    placed by.

    The step's device-time anchor (``gpu_t_ns``, when the exporter records one and it is
    >= 0) is preferred: kernels run on the device, and a host that runs ahead starts its
    step (``t_ns``) before the device has finished the previous one. Otherwise ``t_ns``.
    This is the one place that choice is made.
    """
    return np.where(table.gpu_t_ns >= 0, table.gpu_t_ns, table.t_ns)


def step_matrix(table: StepTable) -> StepMatrix:
    """Pivot a StepTable (one row per rank and step) into dense matrices."""
    ranks, r_idx = np.unique(table.rank, return_inverse=True)
    steps, s_idx = np.unique(table.step, return_inverse=True)
    shape = (len(ranks), len(steps))
    wall = np.full(shape, np.nan)
    gpu = np.full(shape, np.nan)
    phases = np.full((*shape, len(table.phase_names)), np.nan)
    wall[r_idx, s_idx] = table.wall_s
    gpu[r_idx, s_idx] = table.gpu_s
    phases[r_idx, s_idx] = table.phases
    t_ns = np.full(len(steps), np.iinfo(np.int64).max)
    np.minimum.at(t_ns, s_idx, table.t_ns)
    start_ns = np.full(shape, -1, dtype=np.int64)
    start_ns[r_idx, s_idx] = step_start_ns(table)
    host_ns = np.full(shape, -1, dtype=np.int64)
    host_ns[r_idx, s_idx] = table.t_ns
    cpu_wait = np.full(shape, np.nan)
    cpu_wait[r_idx, s_idx] = table.cpu_wait_s
    return StepMatrix(ranks, steps, t_ns, wall, gpu, phases, list(table.phase_names), start_ns,
                      host_ns, cpu_wait)
