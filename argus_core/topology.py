"""Parallel topology: rank coordinates on the dp/tp/pp/ep axes and the peer groups they imply.

Ranks that differ only on axis X form one X-group: the ranks L2 compares (they do the same work
in step with each other) and the members of one X collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus_core.schema import AXES
from argus_core.stats.grouping import dense_ids

# Megatron-style rank order: tp varies fastest, then ep, then dp; pp is outermost.
RANK_ORDER = ("tp", "ep", "dp", "pp")


@dataclass(frozen=True)
class Topology:
    """Sizes of the parallel axes; world size is their product."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            if getattr(self, axis) < 1:
                raise ValueError(f"{axis} must be >= 1, got {getattr(self, axis)}")

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self.dp * self.tp * self.pp * self.ep

    def coords(self) -> np.ndarray:
        """(world_size x 4) coordinates in AXES order, rank order as in RANK_ORDER."""
        ranks = np.arange(self.world_size)
        out = np.zeros((self.world_size, len(AXES)), dtype=np.int64)
        rest = ranks
        for axis in RANK_ORDER:
            size = getattr(self, axis)
            rest, out[:, AXES.index(axis)] = np.divmod(rest, size)
        return out

    @classmethod
    def parse(cls, text: str) -> Topology:
        """Parse ``dp=8,tp=2`` (axes not named are 1)."""
        sizes = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            axis, _, value = part.partition("=")
            if axis not in AXES or not value.isdigit():
                raise ValueError(f"bad topology part {part!r}: expected AXIS=N with AXIS in "
                                 f"{', '.join(AXES)}")
            sizes[axis] = int(value)
        return cls(**sizes)

    def __str__(self) -> str:
        return ",".join(f"{a}={getattr(self, a)}" for a in AXES if getattr(self, a) > 1) or "dp=1"


def axis_groups(coords: np.ndarray, axis: str) -> np.ndarray:
    """Group id of each rank's X-group: ranks equal on every coordinate but ``axis``."""
    keep = [i for i, a in enumerate(AXES) if a != axis]
    ids, _ = dense_ids(*(coords[:, i] for i in keep))
    return ids


def axis_sizes(coords: np.ndarray) -> dict[str, int]:
    """Number of distinct positions on each axis, as observed in ``coords``."""
    return {axis: len(np.unique(coords[:, i])) for i, axis in enumerate(AXES)}
