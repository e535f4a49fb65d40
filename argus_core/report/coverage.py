"""What each level of a diagnosis could judge, and why not: never call a job healthy without
the data to judge it.

L1 needs step records past the warm-up; L2 needs steady steps and ranks with parallel-group
peers; L3 needs kernel records in steady steps and peers to compare them with. A level that
had none of that found nothing because it could not look, which is not the same as healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.detect.diagnose import Diagnosis

LEVELS = ("l1", "l2", "l3")


@dataclass(frozen=True)
class NotJudged:
    """A level of the diagnosis that could not judge the job, and why."""

    level: str  # "l1", "l2" or "l3"
    reason: str

    def to_json(self) -> dict:
        """The ``not_judged`` entry of ``argus diagnose --json``."""
        return {"level": self.level, "reason": self.reason}


def not_judged(d: Diagnosis) -> list[NotJudged]:
    """The levels of ``d`` that had no data to judge, in L1, L2, L3 order."""
    out = []
    steps = len(d.matrix.steps)
    if steps == 0:
        out.append(NotJudged("l1", "no step records"))
        out.append(NotJudged("l2", "no step records"))
    else:
        if not np.asarray(d.l1.judged).any():
            out.append(NotJudged("l1", f"only {steps} step(s), all within the warm-up"))
        ratios = d.l2.ratios
        if ratios is None or ratios.size == 0 or not np.isfinite(ratios).any():
            peers = len(d.matrix.ranks) >= 2
            out.append(NotJudged("l2", "no parallel-group peers to compare ranks with"
                                 if peers and np.asarray(d.l1.steady_mask).any()
                                 else ("no steady steps to compare ranks on" if peers
                                       else "one rank only: no peers to compare it with")))
    scores = d.scores
    if d.kernel_count == 0:
        out.append(NotJudged("l3", "no kernel records"))
    elif scores is None or len(scores) == 0:
        out.append(NotJudged("l3", "no kernel records within the steady steps"))
    elif not np.isfinite(scores.score).any():
        out.append(NotJudged("l3", "no peers to compare kernels with"))
    return out
