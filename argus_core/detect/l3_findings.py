"""L3 on a recorded trace: compress the steady steps' kernels, score them, excuse the waiters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.detect.l1 import L1Result
from argus_core.detect.l3 import KernelScores, L3Config, score_kernels
from argus_core.detect.steps import StepMatrix
from argus_core.schema import AXES
from argus_core.stats.compress import CompressionConfig
from argus_core.summaries import summarize_kernels
from argus_core.taxonomy import is_comm_kernel
from argus_core.trace import Trace


@dataclass(frozen=True)
class KernelFinding:
    """A rank whose kernel (on one stream) is slower than its healthy peers'."""

    rank: int
    kernel: str
    stream: int
    score: float
    comm: bool


def steady_kernels(trace: Trace, matrix: StepMatrix, l1: L1Result):
    """The trace's kernels launched during the steady steps that L2 also analyses.

    Warm-up and spike steps are left to L1, and steps before the last regression onset
    belong to another regime. Kernels are placed in steps by the steps' start times (ranks
    step in lock-step); a trace without step records keeps all its kernels.
    """
    kernels = trace.kernels
    if len(matrix.steps) == 0 or len(kernels) == 0:
        return kernels
    step_of_kernel = np.searchsorted(matrix.t_ns, kernels.start_ns, side="right") - 1
    steady = l1.steady_mask
    keep = (step_of_kernel >= 0) & steady[np.maximum(step_of_kernel, 0)]
    return kernels.take(keep)


def kernel_findings(trace: Trace, matrix: StepMatrix, l1: L1Result, wait_s: dict[int, float],
                    window_s: float, peer_axis: str = "pp",
                    compression: CompressionConfig | None = None,
                    config: L3Config | None = None,
                    ) -> tuple[KernelScores | None, list[KernelFinding], list[KernelFinding]]:
    """(scores, findings, excused).

    A collective kernel includes the time its rank waits for the last member to arrive. A
    collective finding is excused when the rank's measured waiting per step (from its
    communication phases, ``wait_s``) accounts for at least half of the extra kernel time per
    step: that rank is a victim of a late peer, not of a slow link.
    """
    kernels = steady_kernels(trace, matrix, l1)
    if len(kernels) == 0:
        return None, [], []
    summary = summarize_kernels(kernels, window_s, compression)
    ranks = trace.rank_ids
    peer = np.zeros(int(ranks.max()) + 1, dtype=np.int64)
    peer[ranks] = trace.coords(ranks)[:, AXES.index(peer_axis)] if peer_axis else 0
    scores = score_kernels(summary, peer, config)
    steps = max(int(l1.steady_mask.sum()), 1) if len(matrix.steps) else 1
    best: dict[tuple[int, int, int], float] = {}
    extra_s: dict[tuple[int, int, int], float] = {}
    for i in np.flatnonzero(scores.flagged).tolist():
        key = (int(scores.rank[i]), int(scores.kernel[i]), int(scores.stream[i]))
        best[key] = max(best.get(key, 0.0), float(scores.score[i]))
        extra_s[key] = extra_s.get(key, 0.0) + float(
            scores.excess_ns[i] * scores.executions[i]) * 1e-9 / steps
    findings, excused = [], []
    for key, score in sorted(best.items()):
        rank, kernel, stream = key
        name = scores.names[kernel]
        finding = KernelFinding(rank, name, stream, score, is_comm_kernel(name))
        waited = wait_s.get(rank, 0.0) >= 0.5 * extra_s[key]
        (excused if finding.comm and waited else findings).append(finding)
    return scores, findings, excused
