"""The scorer's one dependency on the core's detection (argus_core.detect), in one function.

The core is being reworked (family-wise error control, waiting measured from arrival skew,
per-rank onsets); when its entry points change, ``judge`` is the only code to re-point. It
uses the core's L3 (``score_kernels``, peers as ``argus diagnose`` chooses them: the ranks at
the same position on ``peer_axis``), the core's L2 on the phase medians (which gives each
rank's waiting, measured as its collective time minus its group's shortest, and the pair and
late-arrival logic PromQL cannot express) and the core's verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus_core.schema import AXES
from argus_core.score.snapshot import JobSnapshot


@dataclass
class KernelScoresTable:
    """Per (rank, kernel, stream): the W1 score and whether it is a finding (columns)."""

    rank: np.ndarray
    kernel: np.ndarray  # index into names
    stream: np.ndarray
    score: np.ndarray
    straggler: np.ndarray
    names: list[str]

    def __len__(self) -> int:
        return len(self.rank)


def _empty() -> KernelScoresTable:
    return KernelScoresTable(*(np.zeros(0, dtype=np.int64),) * 3, np.zeros(0),
                             np.zeros(0, dtype=bool), [])


@dataclass
class Judgement:
    """What the scorer publishes for one job."""

    kernels: KernelScoresTable = field(default_factory=_empty)
    verdicts: list[tuple[int, str]] = field(default_factory=list)  # (rank, cause)
    wait_s: dict[int, float] = field(default_factory=dict)  # per rank, per step
    unscored: set[int] = field(default_factory=set)  # known ranks with no score at all


def judge(snapshot: JobSnapshot, peer_axis: str = "pp") -> Judgement:
    """Score a job's kernel summaries with the core's L3, excuse collective kernels whose
    extra time the rank's measured waiting explains (as ``kernel_findings`` does on a trace),
    run the core's L2 on the phase medians, and build the core's verdicts."""
    from argus_core.detect.diagnose import DiagnoseConfig
    from argus_core.detect.l1 import L1Result
    from argus_core.detect.l2 import L2Result, detect_l2
    from argus_core.detect.l3 import score_kernels
    from argus_core.detect.l3_findings import KernelFinding
    from argus_core.detect.steps import StepMatrix
    from argus_core.detect.verdict import build_verdicts
    from argus_core.taxonomy import is_comm_kernel

    config = DiagnoseConfig()
    out = Judgement()

    def l2_of(table) -> L2Result:
        """The core's L2 on one "step" holding each rank's phase statistic."""
        if table is None:
            return L2Result()
        ones = np.full((len(table.ranks), 1), np.nan)
        matrix = StepMatrix(table.ranks, np.zeros(1, dtype=np.int64),
                            np.zeros(1, dtype=np.int64), ones, ones.copy(),
                            table.values[:, None, :], table.names)
        return detect_l2(matrix, table.coords, np.ones(1, dtype=bool), config.l2)

    l2 = l2_of(snapshot.phases)  # medians: robust findings, as on the steady steps offline
    # Waiting as the core measures it (a rank's collective time minus its group's shortest),
    # on mean times per step: what a collective kernel's W1 excess adds up to.
    out.wait_s = (l2_of(snapshot.phase_means) if snapshot.phase_means is not None
                  else l2).wait_s

    summary = snapshot.summary
    findings: list[KernelFinding] = []
    if len(summary):
        top = int(summary.rank.max()) + 1
        peer = np.zeros(top, dtype=np.int64)
        axis = AXES.index(peer_axis)
        for rank, coords in snapshot.coords.items():
            if rank < top:
                peer[rank] = coords[axis]
        scores = score_kernels(summary, peer, config.l3)
        keep = ~np.isnan(scores.score)  # units with too few peers: no score, nothing said
        straggler = scores.flagged & keep
        comm = np.array([is_comm_kernel(n) for n in scores.names], dtype=bool)
        for i in np.flatnonzero(straggler & comm[scores.kernel]).tolist():
            # A collective kernel is long for a rank that waits in it for a late peer: its
            # measured waiting per step explains at least half the extra time -> excused.
            rank = int(scores.rank[i])
            per_step = snapshot.steps_per_s.get(rank, 0.0) * summary.window_ns * 1e-9
            extra_s = scores.excess_ns[i] * scores.executions[i] * 1e-9 / max(per_step, 1.0)
            straggler[i] = out.wait_s.get(rank, 0.0) < 0.5 * extra_s
        out.kernels = KernelScoresTable(scores.rank[keep], scores.kernel[keep],
                                        scores.stream[keep], scores.score[keep],
                                        straggler[keep], scores.names)
        findings = [KernelFinding(int(scores.rank[i]), scores.names[scores.kernel[i]],
                                  int(scores.stream[i]), float(scores.score[i]),
                                  bool(comm[scores.kernel[i]]))
                    for i in np.flatnonzero(straggler).tolist()]
    out.unscored = snapshot.known_ranks - set(np.unique(out.kernels.rank).tolist())
    empty = np.zeros(0)
    no_l1 = L1Result(empty.astype(np.int64), empty, empty, empty.astype(bool))
    out.verdicts = [(v.rank, v.cause) for v in build_verdicts(no_l1, l2, findings)]
    return out
