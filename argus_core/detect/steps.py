"""Steps of all ranks as dense (rank x step) matrices, the shape L1 and L2 work on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.trace import StepTable


@dataclass
class StepMatrix:
    """wall/gpu: (ranks x steps) seconds; phases: (ranks x steps x phases); NaN = not recorded."""

    ranks: np.ndarray
    steps: np.ndarray
    t_ns: np.ndarray  # earliest recorded start of each step
    wall: np.ndarray
    gpu: np.ndarray
    phases: np.ndarray
    phase_names: list[str]

    def phase(self, name: str) -> np.ndarray:
        """(ranks x steps) times of one phase."""
        return self.phases[:, :, self.phase_names.index(name)]


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
    return StepMatrix(ranks, steps, t_ns, wall, gpu, phases, list(table.phase_names))
