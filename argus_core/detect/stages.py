"""Which pipeline stages do alike work, from the kernels they run.

Real first and last stages are heavier (the embedding; the LM head and the loss): comparing
their phase times with the middle stages' would flag them on every healthy job. A stage's
inventory is how many times per step it runs each compute kernel (median over its ranks);
stages with the same inventory are alike and compared along pp, others are not. Without
kernel records nothing says which stages are alike (real stages differ by 5-20% on healthy
runs): each stage is its own class, and L2 does not compare ranks along pp (unless told to,
``l2.compare_unlike_stages``); a stage that slows is then found in time, by L1's regression
and its attribution to the rank whose own compute rose.
"""

from __future__ import annotations

import numpy as np

from argus_core.schema import AXES
from argus_core.stats.grouping import dense_ids
from argus_core.taxonomy import is_comm_kernel
from argus_core.trace import KernelTable


def stage_classes(kernels: KernelTable, step_col: np.ndarray, ranks: np.ndarray,
                  coords: np.ndarray) -> np.ndarray | None:
    """Class of each rank's pipeline stage (ranks in ``ranks`` order): None without a pp
    axis; each stage its own class without compute kernels to tell.

    ``step_col`` is each kernel's step (-1 outside every step), from ``place_kernels``.
    """
    pp = coords[:, AXES.index("pp")]
    if len(np.unique(pp)) < 2:
        return None
    placed = step_col >= 0
    compute = np.array([not is_comm_kernel(n) for n in kernels.names], dtype=bool)
    keep = placed & compute[kernels.name] if len(kernels) else placed
    if not keep.any():
        return np.unique(pp, return_inverse=True)[1].reshape(-1)
    row = np.searchsorted(ranks, kernels.rank[keep])
    n_names = len(kernels.names)
    counts = np.bincount(row * n_names + kernels.name[keep].astype(np.int64),
                         minlength=len(ranks) * n_names).reshape(len(ranks), n_names)
    steps_seen = np.zeros(len(ranks))
    rank_step, _ = dense_ids(row, step_col[keep])
    first = np.unique(rank_step, return_index=True)[1]
    np.add.at(steps_seen, row[first], 1)
    per_step = counts / np.maximum(steps_seen, 1)[:, None]
    stages = np.unique(pp)
    inventory = np.stack([np.median(per_step[pp == s], axis=0) for s in stages])
    signature = np.round(inventory).astype(np.int64)
    _, stage_class = np.unique(signature, axis=0, return_inverse=True)
    return stage_class.reshape(-1)[np.searchsorted(stages, pp)]
