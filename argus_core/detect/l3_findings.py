"""L3 on a recorded trace: compress the judged steps' kernels, score them, name the findings.

Kernels are placed into steps rank by rank (``placement``). Collective kernels are scored on
their transfer time, the wait for the last arriver removed (``kernel_waits``): a rank that
only waited for a late peer is not slow. Collective findings that exist on raw durations but
not on transfer times are reported as ``excused`` (waiting, not a slow link).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.detect.kernel_waits import transfer_durations
from argus_core.detect.l3 import KernelScores, L3Config, score_kernels
from argus_core.detect.placement import Placement
from argus_core.detect.steps import StepMatrix
from argus_core.schema import AXES
from argus_core.stats.compress import CompressionConfig
from argus_core.stats.grouping import dense_ids
from argus_core.summaries import summarize_kernels
from argus_core.taxonomy import is_comm_kernel
from argus_core.topology import axis_groups
from argus_core.trace import KernelTable, Trace


@dataclass(frozen=True)
class KernelFinding:
    """A rank whose kernel (on one stream) is slower than its healthy peers'."""

    rank: int
    kernel: str
    stream: int
    score: float
    comm: bool


def judged_kernels(trace: Trace, matrix: StepMatrix, steps: np.ndarray,
                   placement: Placement) -> tuple[KernelTable, np.ndarray]:
    """The kernels of the judged steps (``steps``: bool per matrix step) and their step.

    A trace without step records keeps all its kernels (step -1).
    """
    kernels = trace.kernels
    if len(matrix.steps) == 0 or len(kernels) == 0:
        return kernels, np.full(len(kernels), -1, dtype=np.int64)
    col = placement.step_col
    keep = (col >= 0) & steps[np.maximum(col, 0)] & ~placement.outside
    return kernels.take(keep), col[keep]


def kernel_findings(trace: Trace, matrix: StepMatrix, steps: np.ndarray, placement: Placement,
                    window_s: float, peer_axis: str = "pp",
                    compression: CompressionConfig | None = None,
                    config: L3Config | None = None,
                    ) -> tuple[KernelScores | None, list[KernelFinding], list[KernelFinding]]:
    """(scores, findings, excused) for the kernels of the judged ``steps``."""
    kernels, step_col = judged_kernels(trace, matrix, steps, placement)
    if len(kernels) == 0:
        return None, [], []
    ranks = trace.rank_ids
    peer = np.zeros(int(ranks.max()) + 1, dtype=np.int64)
    peer[ranks] = trace.coords(ranks)[:, AXES.index(peer_axis)] if peer_axis else 0
    host = np.zeros(len(kernels), dtype=np.int64)
    if matrix.host_ns is not None and (step_col >= 0).any():
        row = np.searchsorted(matrix.ranks, kernels.rank)
        host = matrix.host_ns[np.minimum(row, len(matrix.ranks) - 1), np.maximum(step_col, 0)]
    transfer = transfer_durations(kernels, step_col, _collective_groups(trace, ranks,
                                                                        kernels.rank, peer),
                                  host)
    timed = KernelTable(kernels.rank, kernels.name, kernels.stream, kernels.start_ns, transfer,
                        kernels.names)
    summary = summarize_kernels(timed, window_s, compression)
    steps = _steps_per_window(kernels, step_col, summary.window_ns)
    scores = score_kernels(summary, peer, config, steps)
    findings = _findings(scores)
    excused: list[KernelFinding] = []
    comm_name = np.array([is_comm_kernel(n) for n in kernels.names], dtype=bool)
    waited = comm_name[kernels.name] & (transfer < kernels.dur_ns)
    if waited.any():  # what raw durations would have blamed on the network
        raw = kernels.take(comm_name[kernels.name])
        raw_scores = score_kernels(summarize_kernels(raw, window_s, compression), peer, config,
                                   steps)
        found = {(f.rank, f.kernel, f.stream) for f in findings}
        excused = [f for f in _findings(raw_scores) if (f.rank, f.kernel, f.stream) not in found]
    return scores, findings, excused


def _steps_per_window(kernels: KernelTable, step_col: np.ndarray,
                      window_ns: int) -> np.ndarray | None:
    """Distinct steps with kernels in each window (the most any rank's row can hold)."""
    placed = step_col >= 0
    if not placed.any():
        return None
    window = kernels.start_ns[placed] // window_ns
    first = int(window.min())
    if first < 0:
        return None
    _, (pair_window, _) = dense_ids(window, step_col[placed])
    return np.bincount(pair_window, minlength=int(window.max()) + 1).astype(np.float64)


def _collective_groups(trace: Trace, ranks: np.ndarray, kernel_rank: np.ndarray,
                       peer: np.ndarray) -> list[np.ndarray]:
    """Per kernel, its rank's X-group on every axis with more than one position (the groups a
    collective can run in); the peer sets when the trace has no parallel axes. ``ranks`` are
    the trace's rank ids."""
    coords = np.zeros((int(ranks.max()) + 1, len(AXES)), dtype=np.int64)
    coords[ranks] = trace.coords(ranks)
    out = []
    for i, axis in enumerate(AXES):
        if len(np.unique(coords[ranks, i])) > 1:
            out.append(axis_groups(coords, axis)[kernel_rank])
    return out or [peer[kernel_rank]]


def _findings(scores: KernelScores) -> list[KernelFinding]:
    """One finding per flagged (rank, kernel, stream), with its highest score over windows."""
    best: dict[tuple[int, int, int], float] = {}
    for i in np.flatnonzero(scores.flagged).tolist():
        key = (int(scores.rank[i]), int(scores.kernel[i]), int(scores.stream[i]))
        best[key] = max(best.get(key, 0.0), float(scores.score[i]))
    return [KernelFinding(rank, scores.names[kernel], stream, score,
                          is_comm_kernel(scores.names[kernel]))
            for (rank, kernel, stream), score in sorted(best.items())]
